"""Issue 25 item 7: the Markdown report makes server-provided text inert (model names, error texts, the
target, a run's name and path): no cell is split by a pipe, no code span is closed early by a backtick, no
raw HTML, link or emphasis is opened, no line is broken. Through `loadgen report RUN --format md` and the
comparison's page."""
import re

import orjson
import polars as pl

from loadgen.cli.main import main
from loadgen.report.markdown import code, inert
from tests.synthetic_run import make_run

HOSTILE = "m|x`y`` <img src=x onerror=alert(1)> *b* [link](http://evil) \\| end"
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def _hostile_run(path):
    run = make_run(path, 60)
    m = orjson.loads((run / "manifest.json").read_bytes())
    m["config"]["model"] = HOSTILE
    m["config"]["name"] = HOSTILE + "\n# injected heading"
    m["target"]["url"] = "http://h/`x|y"
    (run / "manifest.json").write_bytes(orjson.dumps(m))
    rows = run / "requests.parquet"
    failed = pl.col("idx") % 3 == 0
    pl.read_parquet(rows).with_columns(
        pl.when(failed).then(pl.lit("http_error")).otherwise(pl.col("outcome")).alias("outcome"),
        pl.when(failed).then(pl.lit(500)).otherwise(pl.col("http_status")).cast(pl.Int32).alias("http_status"),
        pl.when(failed).then(pl.lit("http_500")).otherwise(None).alias("error_kind"),
        pl.when(failed).then(pl.lit(HOSTILE)).otherwise(None).alias("error_detail")).write_parquet(rows)
    return run


def _outside_code(md: str) -> str:
    # what GFM reads as Markdown: the text with its code spans (fenced by equal backtick runs) removed
    return re.sub(r"(?<!`)(`+)(?!`).*?(?<!`)\1(?!`)", "", md)


def _assert_inert(md: str) -> None:
    md = _outside_code(md)
    assert "<img" not in md and "[link](" not in md and "\n# injected" not in md
    assert "*b*" not in md.replace("\\*b\\*", "")
    widths = {}
    for block in md.split("\n\n"):
        lines = [x for x in block.splitlines() if x.startswith("|")]
        if lines:  # one table: every row has as many cells as its header
            widths = {len(CELL_SPLIT.split(x)) for x in lines}
            assert len(widths) == 1, lines
    assert widths, md


def _code_spans_close(line: str) -> None:
    # a code span opened by a fence of N backticks is closed by the next run of exactly N
    runs = re.findall(r"`+", line)
    while runs:
        fence = runs.pop(0)
        assert fence in runs, line
        runs = runs[runs.index(fence) + 1:]


def test_the_run_report_makes_server_text_inert(capsys, tmp_path):
    run = _hostile_run(tmp_path / "r")
    assert main(["report", str(run), "--format", "md"]) == 0
    md = capsys.readouterr().out
    _assert_inert(md)
    assert inert(HOSTILE) in md  # the model and the error text are shown, escaped, not dropped
    _code_spans_close(md.splitlines()[2])  # the path and the target, as code spans


def test_the_comparison_page_makes_paths_inert(capsys, tmp_path):
    a, b = make_run(tmp_path / "a|`x", 60, seed=1), make_run(tmp_path / "b<img>", 60, seed=2)
    c = tmp_path / "c.json"
    assert main(["compare", str(a), str(b), "--format", "json", "--out", str(c)]) in (0, 3)
    capsys.readouterr()
    assert main(["report", str(c), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "<img" not in _outside_code(md)
    heading = next(x for x in md.splitlines() if x.startswith("**B "))
    _code_spans_close(heading)
    assert code(a) in heading and code(b) in heading


def test_code_spans_outfence_any_backtick_run():
    assert code("a``b") == "``` a``b ```"
    assert code("plain") == "`plain`"
    assert code("x|y\nz") == "`x\\|y z`"
