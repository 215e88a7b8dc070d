"""--requests on a [session] workload counts conversations: the help says so and the run says how many
requests that planned (run/launch.py plan_line)."""
import argparse

from loadgen.cli.main import build_parser
from loadgen.config.workload import load
from loadgen.plan.schedule import build
from loadgen.run.launch import plan_line


def test_a_session_workloads_requests_are_conversations_and_the_run_says_how_many_requests():
    schedule = build(load("multi-turn-chat", {"--requests": "30"}))
    assert schedule.info["sessions"] == 30 and len(schedule) > 30
    assert plan_line(schedule) == (f"planned 30 conversations = {len(schedule)} requests (with [session], "
                                   f"--requests and --duration count conversations; each turn is a request)")
    assert plan_line(build(load("quickstart", {"--requests": "30"}))) is None  # one request per arrival: no line


def test_the_help_of_requests_says_what_it_counts():
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    text = " ".join(sub.choices["run"].format_help().split())
    assert "number of requests (with a [session] table: of conversations, each of several requests;" in text
