"""The launcher's output forwarder (stratacl/jobs/_output.py) in-process, on its own pipes:
pieces of lines become whole lines, ranks never cut each other, partial last lines and
over-long lines are forwarded, tags are per line. The multi-rank runs are in test_launcher.py."""
from __future__ import annotations

import io
import os

from stratacl.jobs import _output
from stratacl.jobs._output import OutputForwarder


def _streams():
    out, err = io.BytesIO(), io.BytesIO()
    return (out, err), (io.TextIOWrapper(out, write_through=True), io.TextIOWrapper(err, write_through=True))


def _run(tag: bool, writes: list[tuple[int, int, bytes]], nranks: int = 2) -> tuple[bytes, bytes]:
    """Each write is (rank, stream 0/1, bytes), in order; then every pipe is closed."""
    raw, streams = _streams()
    fwd = OutputForwarder(*streams, tag=tag)
    fwd.start()
    ends = []
    for r in range(nranks):
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        fwd.add(r, out_r, err_r)
        ends.append((out_w, err_w))
    for rank, stream, data in writes:
        os.write(ends[rank][stream], data)
    for w in ends:
        for fd in w:
            os.close(fd)
    fwd.finish(timeout=30)
    return raw[0].getvalue(), raw[1].getvalue()


PIECES = [(0, 0, b"zero: a"), (1, 0, b"one: a"), (0, 0, b"\n"), (1, 1, b"one err\n"), (1, 0, b"\n"),
          (0, 0, b"zero: b\nzero: c"), (0, 0, b"\n")]


def test_pieces_of_lines_from_two_ranks_come_out_whole():
    out, err = _run(False, PIECES)
    assert sorted(out.splitlines()) == [b"one: a", b"zero: a", b"zero: b", b"zero: c"], out
    assert out.endswith(b"\n") and err == b"one err\n"


def test_tagged_lines_carry_their_rank():
    out, err = _run(True, PIECES)
    assert sorted(out.splitlines()) == [b"[0]: zero: a", b"[0]: zero: b", b"[0]: zero: c", b"[1]: one: a"], out
    assert err == b"[1]: one err\n"


def test_a_partial_last_line_gets_its_newline_at_eof():
    out, _ = _run(True, [(0, 0, b"done"), (1, 0, b"x\ntail")])
    assert sorted(out.splitlines()) == [b"[0]: done", b"[1]: tail", b"[1]: x"] and out.endswith(b"\n")


def test_a_line_longer_than_the_limit_is_forwarded_in_pieces():
    long = b"y" * (_output.LINE_LIMIT + 10)
    out, _ = _run(False, [(0, 0, long), (0, 0, b"\n")], nranks=1)
    assert out.replace(b"\n", b"") == long and out.endswith(b"\n")


def test_output_that_cannot_be_written_is_dropped_and_the_pipes_still_drain():
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError
    fwd = OutputForwarder(Closed(), Closed(), tag=False)
    fwd.start()
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    fwd.add(0, out_r, err_r)
    os.set_blocking(out_w, True)
    # 4 MiB: more than a pipe holds; these writes return only if the forwarder keeps reading
    for _ in range(64):
        os.write(out_w, b"z" * 65535 + b"\n")
    os.close(out_w)
    os.close(err_w)
    fwd.finish(timeout=30)
