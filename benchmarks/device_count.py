# Runs on the board (MicroPython). benchmarks/bench.py sends it after its data:
# BLOB, MAGIC and the counter's constants (benchmarks/qemu_count.py), CASES, BASELINES,
# benchmarks/plain_mlp.py (make, step) and the board's counter (count_cmsdk.py on the MPS2
# boards, count_csr.py on VIRT_RV32: w_empty, w_call2, w_call3, counting_on, counting_off).
# It prints one line per measured window, 'W <case> <what> <four raw counter values>', and
# the values the host checks against its simulator, 'V <case> <what> <value>'.
# Every window reads the counter the same way; the host subtracts the empty one.
import gc
import uctypes
import microtrain
from array import array


def show(case, what, r):
    print("W", case, what, r[0], r[1], r[2], r[3])


def blob(where):
    return uctypes.bytearray_at(BLOB + where[0], where[1])


def floats(where):
    return array("f", blob(where))


def trainer_case(name, plan, x, label, n_out, reps, from_file=False):
    # from_file: a plan with a stream section opened as a file (an io.BytesIO of it in the heap, the
    # stream protocol a littlefs file has), its constants read a group at a time (benchmarks/stream_count.py)
    import io
    t = microtrain.Trainer(io.BytesIO(blob(plan)) if from_file else blob(plan))
    xb = blob(x)
    lo = array("f", [0.0])
    out = array("f", bytes(4 * n_out))
    t.step(xb, label, lo)   # step 1 outside the counts; steps 2.. are counted
    for i in range(reps):
        gc.collect()
        show(name, "step", w_call3(t.step, xb, label, lo))
    print("V", name, "loss", lo[0])
    for i in range(reps):
        gc.collect()
        show(name, "predict", w_call2(t.predict, xb, out))
    print("V", name, "out0", out[0])
    print("V", name, "stream_read_bytes", t.info()["stream_read_bytes"])


def baseline_case(name, w1, b1, w2, b2, x, label, lr, momentum, full, reps):
    xs = list(floats(x))
    net = make(floats(w1), floats(b1), floats(w2), floats(b2), len(xs), lr, momentum, full)
    step(net, xs, label)   # step 1 outside the counts, as for the core
    for i in range(reps):
        gc.collect()
        show(name, "baseline", w_call3(step, net, xs, label))
    print("V", name, "baseline_loss", net["loss"])   # the last counted step's: the host checks it


if bytes(blob((0, len(MAGIC)))) != MAGIC:
    raise ValueError("no benchmark data at 0x%x: the board's blob address in benchmarks/qemu_count.py is wrong" % BLOB)
counting = counting_on()
try:
    for i in range(3):
        gc.collect()
        show("-", "empty", w_empty())
    for c in CASES:
        trainer_case(*c)
        gc.collect()
    for c in BASELINES:
        baseline_case(*c)
        gc.collect()
finally:
    counting_off(counting)
print("done")
