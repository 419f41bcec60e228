"""`simulate --plot` and `train --plot`: the loss and accuracy (or mse) curve of a run as a PNG.

matplotlib is an optional dependency (pip install matplotlib, or pip install ./host[plot]):
the plot is checked for before any training, so a missing matplotlib costs no run. The points
plotted are also written into the PNG as a tEXt chunk `microtrain:curve` (JSON), so a script
or a test reads back exactly what the picture shows.
"""
from __future__ import annotations

import json

KEY = "microtrain:curve"


def need_matplotlib(option="--plot"):
    """matplotlib's pyplot on the Agg backend (no display needed), or ValueError saying how to get it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("%s needs matplotlib, an optional dependency: pip install matplotlib (or "
                         "pip install ./host[plot])" % option) from None
    return plt


def for_plot(path, title):
    """The Curve a `--plot path` run fills in (None without --plot); the path and matplotlib are
    checked here, before any training."""
    if not path:
        return None
    from .datafiles import writable
    writable(path, "--plot")
    need_matplotlib()
    return Curve(title, "accuracy")


class Curve:
    """The points of a run: mean loss per epoch and, where measured, a metric per epoch
    (epoch 0: the metric before training)."""

    def __init__(self, title, metric):
        self.title, self.metric = title, metric
        self.loss, self.values = [], []   # [(epoch, value)]

    def add(self, epoch, loss=None, value=None):
        if loss is not None:
            self.loss.append((epoch, float(loss)))
        if value is not None:
            self.values.append((epoch, float(value)))

    def save(self, path):
        plt = need_matplotlib()
        fig, ax = plt.subplots(figsize=(6.4, 4), dpi=100)
        try:
            if self.loss:
                ax.plot(*zip(*self.loss), "o-", color="tab:red", label="mean loss")
            ax.set_xlabel("epoch")
            ax.set_ylabel("mean loss", color="tab:red")
            ax.set_title(self.title)
            if self.values:
                ax2 = ax.twinx()
                ax2.plot(*zip(*self.values), "s-", color="tab:blue", label=self.metric)
                ax2.set_ylabel(self.metric, color="tab:blue")
            ax.xaxis.get_major_locator().set_params(integer=True)
            fig.tight_layout()
            data = {"title": self.title, "metric": self.metric, "loss": self.loss, "values": self.values}
            fig.savefig(path, format="png", metadata={KEY: json.dumps(data)})
        finally:
            plt.close(fig)
