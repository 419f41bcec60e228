"""The Flower ServerApp of a fleet: rounds, strategy, evaluation on the host, checkpoints.

Run config (pyproject.toml's [tool.flwr.app.config] under `flwr run`, or a dict in the
simulation; every key has a default but `plan`):

    plan                the plan the boards run (.mtp), read on the server's host
    test-data           .npz for the evaluation of the global model on this host (x_test/y_test,
                        else x/y); "" for none
    onnx                the model the plan was compiled from: the final global model is also
                        written as OUT/trained.onnx (as `microtrain export` writes it)
    out-dir             checkpoints: OUT/round-NNN.npz per round, OUT/global.npz the newest,
                        OUT/history.json, OUT/accuracy.svg
    num-rounds, local-epochs, local-steps (> 0: samples per round instead of epochs), seed
    strategy            fedavg (default), fedadam, fedyogi, fedadagrad, fedavgm, fedmedian,
                        fedtrimmedavg, fedprox (only with proximal-mu 0: the boards' SGD has no
                        proximal term); server-lr / server-momentum / beta-1 / beta-2 / tau for the
                        adaptive ones. Any flwr Strategy object works from Python (server_app()).
    fraction-train, min-train-nodes, min-available-nodes, fraction-evaluate (federated
                        evaluation on the boards' own samples; 0 by default)
    round-timeout       seconds a round waits for its boards (Flower's timeout; a board still
                        training then is left out of that round and stops)
    checkpoint-every    samples between the boards' own checkpoints within a round
    resume              carry on from OUT/global.npz (the rounds it had are not run again)

Every round: the wrapped strategy's configure_train; the replies checked (FleetStrategy:
a reply from a board with another plan, or with values that are not the plan's, is refused
and never averaged); the strategy's aggregation; int8 trained weights requantized with the
plan's scales (layout.requantize); the global model evaluated and checkpointed. A round
with no usable reply keeps the global model it had."""
from __future__ import annotations

import json
import os
import time
import uuid

import numpy as np

from .layout import Layout

DEFAULTS = {
    "plan": "", "test-data": "", "onnx": "", "out-dir": "fleet-out", "num-rounds": 3, "local-epochs": 1,
    "local-steps": 0, "seed": 0, "strategy": "fedavg", "fraction-train": 1.0, "min-train-nodes": 2,
    "min-available-nodes": 2, "fraction-evaluate": 0.0, "round-timeout": 600.0, "checkpoint-every": 0,
    "resume": False, "server-lr": 0.1, "server-momentum": 0.9, "beta-1": 0.9, "beta-2": 0.99, "tau": 1e-3,
    "proximal-mu": 0.0, "quiet": False,
}
STRATEGIES = ("fedavg", "fedadam", "fedyogi", "fedadagrad", "fedavgm", "fedmedian", "fedtrimmedavg", "fedprox")


def settings(run_config):
    """The run config with defaults; ValueError on an unknown key or a bad value."""
    cfg = dict(DEFAULTS)
    for k, v in dict(run_config).items():
        if k not in DEFAULTS:
            raise ValueError("unknown fleet setting %r; the settings are %s" % (k, ", ".join(sorted(DEFAULTS))))
        cfg[k] = type(DEFAULTS[k])(v) if not isinstance(DEFAULTS[k], bool) else v in (True, "true", "1", 1)
    if not cfg["plan"]:
        raise ValueError("the fleet needs `plan`: the .mtp file the boards run")
    if cfg["strategy"] not in STRATEGIES:
        raise ValueError("strategy %r is not one of %s" % (cfg["strategy"], ", ".join(STRATEGIES)))
    if cfg["strategy"] == "fedprox" and cfg["proximal-mu"]:
        raise ValueError("proximal-mu %g: the boards' optimizer (SGD in the plan) has no proximal term, so FedProx "
                         "would run as FedAvg; use proximal-mu 0 or another strategy" % cfg["proximal-mu"])
    for k in ("num-rounds", "local-epochs", "min-train-nodes", "min-available-nodes"):
        if cfg[k] < (0 if k == "local-epochs" else 1):
            raise ValueError("%s must be at least 1, got %d" % (k, cfg[k]))
    if not cfg["local-epochs"] and not cfg["local-steps"]:
        raise ValueError("a round needs local-epochs or local-steps above 0")
    return cfg


def make_strategy(cfg):
    from flwr.serverapp import strategy as S
    common = dict(fraction_train=cfg["fraction-train"], fraction_evaluate=cfg["fraction-evaluate"],
                  min_train_nodes=cfg["min-train-nodes"], min_evaluate_nodes=cfg["min-train-nodes"],
                  min_available_nodes=cfg["min-available-nodes"])
    name = cfg["strategy"]
    if name in ("fedadam", "fedyogi", "fedadagrad"):
        cls = {"fedadam": S.FedAdam, "fedyogi": S.FedYogi, "fedadagrad": S.FedAdagrad}[name]
        extra = dict(eta=cfg["server-lr"], tau=cfg["tau"])
        if name != "fedadagrad":
            extra.update(beta_1=cfg["beta-1"], beta_2=cfg["beta-2"])
        return cls(**common, **extra)
    if name == "fedavgm":
        return S.FedAvgM(**common, server_learning_rate=cfg["server-lr"], server_momentum=cfg["server-momentum"])
    if name == "fedprox":
        return S.FedProx(**common, proximal_mu=0.0)
    return {"fedavg": S.FedAvg, "fedmedian": S.FedMedian, "fedtrimmedavg": S.FedTrimmedAvg}[name](**common)


def _load_test(path):
    if not path:
        return None
    d = np.load(path)
    if "x_test" in d.files and "y_test" in d.files:
        return d["x_test"], d["y_test"]
    return d["x"], d["y"]


def _strategy_base():
    from flwr.serverapp.strategy import Strategy
    return Strategy


class Fleet:
    """The server's state of a fleet run: the plan, the global model's checkpoints and the
    per-round history (what the demo prints and docs/fleet.md quotes)."""

    def __init__(self, cfg, plan, say=print):
        from ..simulator import Simulator
        self.cfg = cfg
        self.plan = plan
        self.layout = Layout(plan)
        self.sim = Simulator(plan)
        self.test = _load_test(cfg["test-data"])
        self.out = cfg["out-dir"]
        os.makedirs(self.out, exist_ok=True)
        self.history = []
        self.rounds = {}        # round -> facts gathered by the strategy wrapper
        self.offset = 0         # rounds done before a resume
        self.ports_of = {}      # Flower node id -> the board's port, from its replies
        self.say = say

    def initial(self):
        """The plan's values, or with resume the newest checkpoint (of this plan)."""
        start = self.layout.requantize(self.sim.params())
        path = os.path.join(self.out, "global.npz")
        if self.cfg["resume"] and os.path.exists(path):
            d = np.load(path)
            if int(d["__plan_crc__"]) != self.layout.crc:
                raise ValueError("%s holds the global model of plan %08x, this fleet trains plan %08x: start in another "
                                 "out-dir or without resume" % (path, int(d["__plan_crc__"]), self.layout.crc))
            self.offset = int(d["__round__"])
            start = {k: d[k] for k in d.files if not k.startswith("__")}
            self.layout.check(start, path)
            hist = os.path.join(self.out, "history.json")
            if os.path.exists(hist):
                with open(hist) as f:
                    self.history = [h for h in json.load(f)["rounds"] if h["round"] <= self.offset]
            self.say("resuming from %s: round %d" % (path, self.offset))
        return start

    def evaluate(self, values):
        if self.test is None:
            return None
        self.sim.reset()
        self.sim.set_params(values)
        return float(self.sim.evaluate(*self.test))

    def checkpoint(self, server_round, values):
        """round-NNN.npz and global.npz (written then renamed: a crash leaves the previous one)."""
        r = server_round + self.offset
        extra = {"__plan_crc__": np.uint32(self.layout.crc), "__round__": np.int64(r)}
        for name in ("round-%03d.npz" % r, "global.npz"):
            tmp = os.path.join(self.out, name + ".tmp.npz")
            np.savez(tmp, **values, **extra)
            os.replace(tmp, os.path.join(self.out, name))

    def record(self, server_round, values):
        """evaluate_fn: after each round (and before the first) evaluate, checkpoint, print."""
        r = server_round + self.offset
        acc = self.evaluate(values)
        self.checkpoint(server_round, values)
        facts = self.rounds.get(server_round, {})
        entry = {"round": r, "accuracy": acc, **facts}
        if server_round == 0 and self.offset:
            return acc
        self.history = [h for h in self.history if h["round"] != r] + [entry]
        self.write_history()
        metric = "accuracy" if self.plan.loss == "cross-entropy" else "mse"
        line = "round %d: global %s %s" % (r, metric, "%.4f" % acc if acc is not None else "(no test data)")
        if server_round:
            line += " (%d of %d boards averaged%s; %.1f s; link %d B out, %d B in)" % (
                len(facts.get("accepted", [])), facts.get("sampled", 0),
                "; %d left out" % len(facts["left_out"]) if facts.get("left_out") else "",
                facts.get("seconds", 0.0), facts.get("bytes_out", 0), facts.get("bytes_in", 0))
        self.say(line)
        return acc

    def write_history(self):
        hist = {"plan_crc": "%08x" % self.layout.crc, "settings": {k: v for k, v in self.cfg.items()},
                "down_bytes_per_board": self.layout.down_bytes, "up_bytes_per_board": self.layout.up_bytes,
                "rounds": self.history}
        tmp = os.path.join(self.out, "history.json.tmp")
        with open(tmp, "w") as f:
            json.dump(hist, f, indent=1)
        os.replace(tmp, os.path.join(self.out, "history.json"))
        from .plot import accuracy_svg
        accuracy_svg(self.history, os.path.join(self.out, "accuracy.svg"))

    def finish(self, values):
        np.savez(os.path.join(self.out, "params.npz"), **values)
        if self.cfg["onnx"]:
            self.plan.export(values, self.cfg["onnx"], os.path.join(self.out, "trained.onnx"))
            self.say("wrote %s (the global model, as `microtrain export` writes it)" % os.path.join(self.out, "trained.onnx"))


def wrap(inner, fleet):
    """A Strategy that runs `inner` (any flwr Strategy) on a fleet of boards: it refuses replies
    from boards with another plan or with values that are not the plan's, requantizes the
    aggregate's int8 weights, and records each round's boards, bytes and seconds."""
    Strategy = _strategy_base()

    class FleetStrategy(Strategy):
        def summary(self):
            inner.summary()

        def configure_train(self, server_round, arrays, config, grid):
            msgs = list(inner.configure_train(server_round, arrays, config, grid))
            fleet.rounds[server_round] = {"sampled": len(msgs), "started": time.monotonic(),
                                          "asked": [m.metadata.dst_node_id for m in msgs]}
            return msgs

        def aggregate_train(self, server_round, replies):
            from flwr.app import Array, ArrayRecord
            facts = fleet.rounds.setdefault(server_round, {"sampled": 0, "started": time.monotonic()})
            accepted, left_out, nodes = [], {}, {}
            bytes_out = bytes_in = 0
            replies = list(replies)
            for node in set(facts.pop("asked", [])) - {m.metadata.src_node_id for m in replies}:
                left_out[str(node)] = "no reply within the round's timeout (%g s)" % fleet.cfg["round-timeout"]
            for msg in replies:
                node = msg.metadata.src_node_id
                if msg.has_error():
                    left_out[str(node)] = _reason(msg.error.reason)
                    continue
                c = msg.content
                info = dict(c["fleet"]) if "fleet" in c.config_records else {}
                why = None
                if info.get("port"):
                    fleet.ports_of[str(node)] = info["port"]
                if info.get("error"):
                    why = info["error"]
                elif int(info.get("plan-crc", -1)) != fleet.layout.crc:
                    why = ("refused: the board runs plan %08x, the fleet plan %08x"
                           % (int(info.get("plan-crc", 0)) & 0xFFFFFFFF, fleet.layout.crc))
                else:
                    try:
                        arrays = c["arrays"]
                        vals = {k: arrays[k].numpy() for k in arrays.keys()}
                        fleet.layout.check(vals, "its values")
                        if not all(np.all(np.isfinite(v)) for v in vals.values()):
                            raise ValueError("its values are not finite")
                    except (KeyError, ValueError) as e:
                        why = "refused: %s" % e
                if why:
                    left_out[str(node)] = why
                    continue
                accepted.append(msg)
                bytes_out += int(info.get("bytes-out", 0))
                bytes_in += int(info.get("bytes-in", 0))
                m = dict(c["metrics"]) if "metrics" in c.metric_records else {}
                nodes[str(node)] = {"port": info.get("port"), "samples": m.get("num-examples"),
                                    "loss": m.get("train-loss"), "accuracy": m.get("train-accuracy"),
                                    "seconds": info.get("seconds"), "recoveries": info.get("recoveries", 0),
                                    "resumed_at": list(info.get("resumed-at", []))}
            left_out = {fleet.ports_of.get(k, "node %s" % k): v for k, v in left_out.items()}
            for who, why in left_out.items():
                fleet.say("round %d: the board on %s left out: %s" % (server_round + fleet.offset, who, why))
            arrays, metrics = (None, None)
            if accepted:
                arrays, metrics = inner.aggregate_train(server_round, accepted)
            if arrays is not None:
                vals = fleet.layout.requantize({k: arrays[k].numpy() for k in arrays.keys()})
                arrays = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in vals.items()})
            facts.update(accepted=sorted(nodes), left_out=left_out, nodes=nodes, bytes_out=bytes_out,
                         bytes_in=bytes_in, seconds=time.monotonic() - facts.pop("started"))
            if metrics is not None:
                facts["train"] = {k: float(v) for k, v in metrics.items() if not isinstance(v, list)}
            return arrays, metrics

        def configure_evaluate(self, server_round, arrays, config, grid):
            return inner.configure_evaluate(server_round, arrays, config, grid)

        def aggregate_evaluate(self, server_round, replies):
            m = inner.aggregate_evaluate(server_round, [r for r in replies if not r.has_error()])
            if m is not None:
                fleet.rounds.setdefault(server_round, {})["boards_eval"] = {k: float(v) for k, v in m.items()
                                                                            if not isinstance(v, list)}
            return m

    return FleetStrategy()


def _reason(reason):
    """A ClientApp's exception as Flower reports it ("<class ...>:<'Exception ClientAppException occurred.
    Message: ...'>"), without its wrapping: the exception's own one line, which says why and what to do."""
    text = str(reason).strip()
    if text.endswith("'>"):
        text = text[:-2]
    if "Message:" in text:
        text = text.rsplit("Message:", 1)[1]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else str(reason)


def run(grid, context_config, strategy=None, say=print):
    """The ServerApp's body: returns the Fleet (its history and checkpoints)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord
    from ..plan import load_plan
    cfg = settings(context_config)
    plan = load_plan(cfg["plan"])
    fleet = Fleet(cfg, plan, say=say)
    start = fleet.initial()
    rounds = cfg["num-rounds"] - fleet.offset
    inner = strategy or make_strategy(cfg)
    s = wrap(inner, fleet)
    train_config = dict(fleet.layout.to_config())
    train_config.update({"fleet-id": uuid.uuid4().hex[:12], "seed": cfg["seed"], "local-epochs": cfg["local-epochs"],
                         "local-steps": cfg["local-steps"], "checkpoint-every": cfg["checkpoint-every"],
                         "round-timeout": cfg["round-timeout"], "round-offset": fleet.offset})
    if rounds > 0:
        result = s.start(grid=grid, initial_arrays=ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in start.items()}),
                         num_rounds=rounds, timeout=cfg["round-timeout"], train_config=ConfigRecord(train_config),
                         evaluate_config=ConfigRecord(dict(train_config)),
                         evaluate_fn=lambda r, arrays: _metric(fleet.record(r, {k: arrays[k].numpy() for k in arrays.keys()})))
        final = {k: result.arrays[k].numpy() for k in result.arrays.keys()} if result.arrays is not None else start
    else:
        final = start
    fleet.finish(final)
    return fleet


def _metric(acc):
    from flwr.app import MetricRecord
    return None if acc is None else MetricRecord({"accuracy": acc})


def server_app(run_config=None, strategy=None, say=print, on_done=None):
    """A ServerApp. run_config: settings (see the module docstring) over the context's own run
    config (`flwr run`'s); strategy: any flwr Strategy instead of the configured one;
    on_done(fleet) gets the finished run (the simulation's way back to its caller)."""
    from flwr.serverapp import ServerApp
    app = ServerApp()

    @app.main()
    def main(grid, context):
        conf = dict(context.run_config)
        conf.update(run_config or {})
        fleet = run(grid, conf, strategy=strategy, say=say)
        if on_done:
            on_done(fleet)

    return app


def _deployed_app():
    try:
        return server_app()
    except ImportError:
        return None


app = _deployed_app()
