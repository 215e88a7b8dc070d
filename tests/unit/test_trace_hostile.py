"""Issue 15 defects 6 and 7: hostile trace rows are named by file and line, all at once, and
--skip-bad-rows can skip every kind of them (ragged CSV rows, NaN/inf timestamps, numbers beyond 64
bits); a trace without rows is an error. Never a library error without a line, never a traceback."""
import pytest

from loadgen.plan import traces
from loadgen.plan.traces import TraceError

BG_HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
AZ_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


BAD_CSV = {
    "burstgpt": (BG_HEAD + "0.5,m,10,5,15,c\n"
                 "1.0,m,10,5,15,c,EXTRA\n"         # line 3: ragged (one field too many)
                 "nan,m,10,5,15,c\n"               # line 4: NaN timestamp
                 "inf,m,10,5,15,c\n"               # line 5: inf timestamp
                 "1e300,m,10,5,15,c\n"             # line 6: beyond int64 ns
                 "2.0,m,99999999999999999999999,5,0,c\n"  # line 7: beyond 64 bits
                 "2.5,m,10\n"                      # line 8: ragged (too few)
                 "3.0,m,12,6,18,c\n", [3, 4, 5, 6, 7, 8]),
    "azure": (AZ_HEAD + "2024-01-01 00:00:00.5,10,5\n"
              "2024-01-01 00:00:01,10,5,7\n"            # line 3: ragged
              "2024-01-01 00:00:02,18446744073709551616,5\n"  # line 4: 2**64
              "2024-01-01 00:00:03,12,6\n", [3, 4]),
}


@pytest.mark.parametrize("fmt", list(BAD_CSV))
def test_csv_bad_rows_are_named_by_line_all_at_once(tmp_path, fmt):
    text, lines = BAD_CSV[fmt]
    p = _write(tmp_path, "t.csv", text)
    with pytest.raises(TraceError) as e:
        traces.read(p, fmt)
    named = [int(x.split(":")[1]) for x in e.value.problems if x.startswith(f"{p}:") and x.split(":")[1].isdigit()]
    assert named == lines, e.value.problems


@pytest.mark.parametrize("fmt", list(BAD_CSV))
def test_csv_bad_rows_can_be_skipped(tmp_path, fmt):
    text, lines = BAD_CSV[fmt]
    t = traces.read(_write(tmp_path, "t.csv", text), fmt, skip_bad_rows=True)
    assert len(t) == 2 and t.skipped["bad_rows"] == len(lines)
    assert list(t.prompt_tokens) == [10, 12]


def test_jsonl_numbers_beyond_64_bits_are_bad_rows(tmp_path):
    p = _write(tmp_path, "t.jsonl",
               '{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
               '{"timestamp": 1e300, "input_length": 5, "output_length": 2}\n'
               '{"timestamp": 2, "input_length": 18446744073709551615, "output_length": 2}\n'
               '{"timestamp": 3, "input_length": 5, "output_length": 2}\n')
    with pytest.raises(TraceError) as e:
        traces.read(p, "mooncake")
    assert [x.split(":")[1] for x in e.value.problems[:2]] == ["2", "3"], e.value.problems
    t = traces.read(p, "mooncake", skip_bad_rows=True)
    assert len(t) == 2 and t.skipped["bad_rows"] == 2


@pytest.mark.parametrize("name, text, fmt", [("t.csv", AZ_HEAD, "azure"), ("t.csv", BG_HEAD, "burstgpt"),
                                             ("t.jsonl", "\n", "jsonl")])
def test_a_trace_without_rows_is_an_error(tmp_path, name, text, fmt):
    with pytest.raises(TraceError) as e:
        traces.read(_write(tmp_path, name, text), fmt)
    assert "no requests" in str(e.value)


def test_a_trace_whose_every_row_is_skipped_is_an_error(tmp_path):
    p = _write(tmp_path, "t.csv", AZ_HEAD + "bogus,1,1\n")
    with pytest.raises(TraceError) as e:
        traces.read(p, "azure", skip_bad_rows=True)
    assert "no requests" in str(e.value) and "1 bad row" in str(e.value)


# Issue 25 item 7: a byte that is not UTF-8 is named by its line (and field or column), in every format,
# with the good rows around it read (or kept, with --skip-bad-rows); Polars' own error had no line.
NOT_UTF8 = {
    "azure": (AZ_HEAD.encode() + b"2024-01-01 00:00:00,10,5\n2024-01-01 00:00:01,1\xff0,5\n"
              b"2024-01-01 00:00:02,10,5\n", "t.csv", "t.csv:3: is not UTF-8 text (byte 0xff in field 2)"),
    "burstgpt": (BG_HEAD.encode() + b"0.5,m,10,5,15,c\n1.0,m\xfe,10,5,15,c\n2.0,m,10,5,15,c\n", "t.csv",
                 "t.csv:3: is not UTF-8 text (byte 0xfe in field 2)"),
    "jsonl": (b'{"intended_ns": 0, "prompt_tokens": 5, "max_tokens": 5}\n'
              b'{"intended_ns": 1, "prompt_tokens": 5, "max_tokens": 5, "x": "\xc3"}\n'
              b'{"intended_ns": 2, "prompt_tokens": 5, "max_tokens": 5}\n', "t.jsonl",
              "t.jsonl:2: is not UTF-8 text (byte 0xc3 at column 63)"),
}


@pytest.mark.parametrize("fmt", sorted(NOT_UTF8))
def test_a_byte_that_is_not_utf8_is_named_by_line(tmp_path, fmt):
    data, name, problem = NOT_UTF8[fmt]
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(TraceError) as e:
        traces.read(p, fmt)
    assert any(x.endswith(problem) for x in e.value.problems), e.value.problems
    t = traces.read(p, fmt, skip_bad_rows=True)
    assert len(t) == 2 and t.skipped == {"bad_rows": 1}
