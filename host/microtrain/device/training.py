"""A training run streamed to a board: the loop behind `microtrain train`.

The run is a fixed sequence of samples: epoch e trains the samples of x in the order
np.random.default_rng(seed) gives for that epoch, as Simulator.fit(x, y, epochs,
seed=seed) does, so the host simulator is the oracle of what the board ends with.
The board counts the samples of the run it has trained; its count is the truth, and
after a reset or a lost link the host carries on from the count the board restored
from its last checkpoint. No sample is trained twice into the final parameters, and
none is skipped."""
from __future__ import annotations

import sys
import time
import zlib

import numpy as np

from .errors import LinkError


def run_id(plan_crc, x, y, seed):
    """The id of a run: its plan, its data and its shuffle seed (not its epochs, so a
    run can be resumed for more epochs)."""
    crc = zlib.crc32(np.asarray([plan_crc, seed], "<u8").tobytes())
    crc = zlib.crc32(np.ascontiguousarray(x).tobytes(), crc)
    return zlib.crc32(np.ascontiguousarray(y).tobytes(), crc)


class EpochOrder:
    """Sample k of the run -> (epoch, row of x); the same shuffles as Simulator.fit."""

    def __init__(self, n, seed):
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.orders = []

    def rows(self, epoch, start, stop):
        while len(self.orders) <= epoch:
            self.orders.append(self.rng.permutation(self.n))
        return self.orders[epoch][start:stop]


class Progress:
    """A live bar on stderr (tqdm) with loss, running accuracy, samples/s and the board's heap."""

    def __init__(self, total, initial, epochs, n, ce, heap_total, enabled=None):
        self.bar = None
        self.ce = ce
        self.heap_total = heap_total
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, unit="sample", dynamic_ncols=True, file=sys.stderr,
                            desc="epoch %d/%d" % (min(epochs, initial // n + 1), epochs))
        self.epochs, self.n = epochs, n

    def update(self, samples, epoch_loss, epoch_acc, heap_free):
        if self.bar is None:
            return
        self.bar.set_description("epoch %d/%d" % (min(self.epochs, samples // self.n + 1), self.epochs), False)
        post = {"loss": "%.4f" % epoch_loss}
        if self.ce and epoch_acc is not None:
            post["acc"] = "%.1f%%" % (100 * epoch_acc)
        post["heap"] = "%.1f/%.0fKB" % ((self.heap_total - heap_free) / 1024, self.heap_total / 1024)
        self.bar.set_postfix(post, refresh=False)
        self.bar.n = samples
        self.bar.refresh()

    def write(self, line):
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def train(board, x, y, epochs=1, seed=0, resume=False, checkpoint_every=0, accuracy=True,
          progress=None, on_epoch=None, max_recoveries=20, log=None):
    """Train the board's plan on (x, y) for some epochs; returns a summary dict.

    checkpoint_every: samples between checkpoints (0: only at the end). A board reset
    or a lost link is recovered from (up to max_recoveries times): the host reconnects,
    the board restores its last checkpoint, and the run carries on from there.
    on_epoch(epoch, mean loss, accuracy or None) after each epoch; log(line) for notes."""
    x, y = board.check_data(x, y)
    n = len(x)
    if n == 0:
        raise ValueError("no samples to train on")
    total = n * epochs
    run = run_id(board.facts["plan"]["crc"], x, y, seed)
    order = EpochOrder(n, seed)
    ce = board.facts["plan"]["ce"]
    log = log or (lambda line: None)
    recoveries = 0

    def recover(err):
        nonlocal recoveries
        recoveries += 1
        if recoveries > max_recoveries:
            raise err
        log("link lost (%s); reconnecting and resuming from the board's last checkpoint" % err)
        board.reconnect()
        got = board.start_run(run, resume=True)
        log("resuming at sample %d" % got)
        return got

    samples = board.start_run(run, resume=resume)
    if resume:
        log("resuming run at sample %d of %d" % (samples, total))
    saved = samples if not resume else -1     # a resumed run may be ahead of its checkpoint
    heap_total = board.facts["mem_free"] + board.facts["mem_alloc"]
    bar = progress(total, samples, epochs, n, ce, heap_total) if progress else None
    chunks = []         # (first sample, trained, loss sum, correct) of this process's chunks
    t0, trained_here = time.monotonic(), 0
    heap_free = board.facts["mem_free"]

    def epoch_stats(epoch):
        lo, hi = epoch * n, (epoch + 1) * n
        rs = [c for c in chunks if lo <= c[0] < hi]
        cnt = sum(c[1] for c in rs)
        if not cnt:
            return float("nan"), None
        return sum(c[2] for c in rs) / cnt, (sum(c[3] for c in rs) / cnt if accuracy and ce else None)

    while samples < total or saved != samples:
        try:
            if samples >= total:        # the end: checkpointed, so a reset keeps the trained model
                board.save()
                saved = samples
                continue
            epoch, pos = divmod(samples, n)
            stop = min((epoch + 1) * n, total)
            if checkpoint_every:
                stop = min(stop, (samples // checkpoint_every + 1) * checkpoint_every)
            # train_chunk sends as many of these as fit in a frame
            rows = order.rows(epoch, pos, pos + min(stop - samples, board.rows(board.sizer.limit, x, y)))
            got, done, correct, loss_sum, heap_free = board.train_chunk(samples, x[rows], y[rows], accuracy)
            if done:
                chunks.append((got - done, done, loss_sum, correct))
                trained_here += done
            if got < samples:   # the board is behind: it lost state without our noticing
                chunks = [c for c in chunks if c[0] + c[1] <= got]
            prev_epoch = samples // n
            samples = got
            if bar:
                bar.update(samples, *epoch_stats(min(samples // n, epochs - 1)), heap_free)
            if samples // n > prev_epoch and on_epoch:
                on_epoch(prev_epoch + 1, *epoch_stats(prev_epoch))
            if checkpoint_every and samples % checkpoint_every == 0 and samples != saved:
                board.save()
                saved = samples
        except LinkError as e:
            samples = saved = recover(e)
            chunks = [c for c in chunks if c[0] + c[1] <= samples]
    if bar:
        bar.close()
    elapsed = time.monotonic() - t0
    return {"samples": samples, "trained": trained_here, "seconds": elapsed,
            "samples_per_s": trained_here / elapsed if elapsed > 0 else float("nan"),
            "recoveries": recoveries, "run": run, "heap_free": heap_free, "stats": board.stats}
