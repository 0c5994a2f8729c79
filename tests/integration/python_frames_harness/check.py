"""Run by test_python_frames_versions.py under each interpreter, with the directory of the
frames_harness extension built for it: exits 0 when both native readers agree with the
interpreter's own view of its stacks, else prints the first difference and exits 1."""

import array
import sys
import threading

sys.path.insert(0, sys.argv[1])
import frames_harness as harness  # noqa: E402

Frame = tuple  # (qualified name, file, line)


def stack_of(frame) -> tuple:  # noqa: ANN001
    out = []
    while frame is not None:
        out.append((frame.f_code.co_qualname, frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(reversed(out))


# --- op callers: every op's recorded caller is the stack that called it ---------------------------

expected: list[tuple[int, tuple]] = []


def op(nested: int = 0, kernel=None) -> None:  # noqa: ANN001
    expected.append((threading.get_native_id(), stack_of(sys._getframe(1))))
    if kernel is None:
        harness.fake_op(nested)
    else:
        harness.fake_op(nested, kernel)


def python_kernel() -> None:
    """Python run inside an op, whose ops keep the outer op's caller (no record of their own)."""
    for _ in range(2):
        harness.inner_op()


class Model:
    def layer(self, n: int) -> list:
        if n:
            return self.layer(n - 1)
        op(); op(2)  # two ops on one line; the second with ops inside it  # noqa: E702
        op(kernel=python_kernel)
        return [op() for _ in range(2)]


def tokens():
    for i in range(3):
        op()
        yield i


def decode() -> None:
    for i in range(200):
        Model().layer(i % 7)
        list(tokens())


def by_line(chain: tuple) -> tuple:
    """A chain as its lines, the innermost frame (op()'s own call line) by name only."""
    return tuple((name, line) for name, _, line in chain[:-1]) + ((chain[-1][0],),)


def collapsed(chains: list) -> list:
    out: list = []
    for chain in chains:
        if not out or out[-1] != chain:
            out.append(chain)
    return out


def check_callers() -> int:
    harness.start()
    try:
        harness.start()
        print("a second start was not refused")
        return 1
    except RuntimeError:
        pass
    threads = [threading.Thread(target=decode) for _ in range(3)]
    for t in threads:
        t.start()
    decode()
    for t in threads:
        t.join()
    harness.stop()
    chains = harness.chains()
    changes = 0
    for tid, records, lost in harness.drain():
        if lost:
            print(f"thread {tid} lost {lost} changes")
            return 1
        ids = array.array("I")
        ids.frombytes(records)
        got = collapsed([by_line(tuple(tuple(f) for f in chains[c])) for c in ids[2::4]])
        want = collapsed([by_line(stack + (("op", "", 0),)) for t, stack in expected if t == tid])
        if got != want:
            pairs = enumerate(zip(got, want, strict=False))
            first = next((i for i, (a, b) in pairs if a != b), min(len(got), len(want)))
            print(f"thread {tid}: {len(got)} changes recorded, {len(want)} expected; first difference at {first}:")
            print("  recorded:", got[first] if first < len(got) else None)
            print("  expected:", want[first] if first < len(want) else None)
            return 1
        changes += len(got)
    if changes != 4 * 200 * 4:  # per thread and iteration: 4 lines of Model.layer, 1 of tokens
        print(f"only {changes} changes recorded")
        return 1
    print(f"op callers: {changes} changes on 4 threads, each the interpreter's own stack")
    return 0


# --- the sampler's reader: every thread's stack, read while threads start and end -----------------

def parked(depth: int, ready: threading.Event, done: threading.Event) -> None:
    if depth:
        return parked(depth - 1, ready, done)
    ready.set()
    done.wait()


def check_reader() -> int:
    done = threading.Event()
    sleepers = []
    for depth in (0, 5, 30):
        ready = threading.Event()
        t = threading.Thread(target=parked, args=(depth, ready, done))
        t.start()
        ready.wait()
        sleepers.append(t)
    stop_churn = threading.Event()

    def churn() -> None:
        while not stop_churn.is_set():
            t = threading.Thread(target=lambda: None)
            t.start()
            t.join()

    churner = threading.Thread(target=churn)
    churner.start()
    me = threading.get_ident()
    try:
        for _ in range(300):
            truth = {ident: stack_of(frame) for ident, frame in sys._current_frames().items()}
            read = harness.read(me)
            table = harness.frames()
            native = {}
            for ident, _, packed in read:
                ids = array.array("I")
                ids.frombytes(packed)
                native[ident] = tuple(tuple(table[i]) for i in ids)
            for t in sleepers:
                if native.get(t.ident) != truth.get(t.ident):
                    print("reader: thread", t.ident)
                    print("  native:", native.get(t.ident))
                    print("  truth: ", truth.get(t.ident))
                    return 1
    finally:
        stop_churn.set()
        churner.join()
        done.set()
        for t in sleepers:
            t.join()
    print("reader: 300 reads beside threads starting and ending, each parked thread's stack exact")
    return 0


sys.exit(check_callers() or check_reader())
