"""The Flower ClientApp of a board: it lives on the host the board is plugged into.

Deployment (docs/fleet.md): one SuperNode per board,

    flower-supernode --superlink HOST:9092 --node-config 'port="/dev/ttyACM0"' ...

runs `microtrain.fleet.client:app`, which takes the board's port from its node config.
In Flower's simulation engine (microtrain.fleet.sim) the virtual SuperNode k drives the
k-th of the emulated boards' ports (client_app(ports)).

A train message carries the global values of the plan's trainable parameters (ArrayRecord
"arrays") and the round's settings (ConfigRecord "config", from server.py: the plan's CRC
and its layout, local epochs or steps, seed, checkpoint interval, the round's timeout). The
reply: the trained values (ArrayRecord "arrays"), MetricRecord "metrics" with num-examples
(the samples the board holds: FedAvg's weight), train-loss and train-accuracy, and
ConfigRecord "fleet" (the board's plan CRC, its port, the bytes the round took over the
link each way, seconds, recoveries) for the server's checks and figures. A board running
another plan answers with the "fleet" record alone, naming its plan and the error; the
server refuses it by that hash. Any other failure (the board gone, silent until the round's
deadline) is an exception, which Flower returns as the node's error; either way the round
goes on without it."""
from __future__ import annotations

import json
import os
import time

import numpy as np

from .board import FleetBoard, PlanMismatch, board_lock, round_run, round_seed
from .layout import Layout

PORTS_ENV = "MICROTRAIN_FLEET_PORTS"    # comma-separated ports, indexed by Flower's partition-id


def _port(context, ports):
    """The board's port: the node config's `port`; else ports[partition-id], ports being a list or
    a JSON file of one, read at each message (a board plugged in again may come back on another
    port), or $MICROTRAIN_FLEET_PORTS."""
    node = context.node_config
    if "port" in node:
        return str(node["port"])
    if isinstance(ports, str):
        with open(ports) as f:
            ports = json.load(f)
    ports = ports or [p for p in os.environ.get(PORTS_ENV, "").split(",") if p]
    pid = node.get("partition-id")
    if pid is None or int(pid) >= len(ports):
        raise ValueError("this SuperNode has no board: start it with --node-config 'port=\"/dev/ttyACM0\"' "
                         "(or set %s for a simulated fleet)" % PORTS_ENV)
    return ports[int(pid)]


def _values(arrays, layout):
    vals = {k: arrays[k].numpy() for k in arrays.keys()}
    layout.check(vals, "the server's values")
    return vals


def _start(msg, context, ports):
    """What a message asks of this node: (config, layout, global values, port, timeout, start time)."""
    t0 = time.monotonic()
    cfg = msg.content["config"]
    if float(cfg.get("proximal-mu", 0) or 0):
        raise ValueError("proximal-mu %g: the board's optimizer (the plan's SGD) has no proximal term; run FedProx "
                         "with proximal-mu 0, or another strategy" % float(cfg["proximal-mu"]))
    layout = Layout.from_config(cfg)
    values = _values(msg.content["arrays"], layout)
    return cfg, layout, values, _port(context, ports), float(cfg.get("round-timeout", 0) or 0), t0


def _fleet_record(board_crc, port, seconds, res=None, error=""):
    from flwr.app import ConfigRecord
    rec = {"plan-crc": int(board_crc), "port": port, "seconds": float(seconds), "error": error}
    if res is not None:
        rec.update({"bytes-out": int(res.link_bytes["out"]), "bytes-in": int(res.link_bytes["in"]),
                    "recoveries": int(res.recoveries), "stored": int(res.stored), "trained": int(res.trained),
                    "resumed-at": [int(k) for k in res.resumed_at]})
    return ConfigRecord(rec)


def train_message(msg, context, ports=None, baud=115200):
    """The ClientApp's train handler (a function, so that the simulation can bind ports)."""
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    cfg, layout, values, port, timeout, t0 = _start(msg, context, ports)
    deadline = t0 + timeout if timeout else None
    server_round = int(cfg["server-round"]) + int(cfg.get("round-offset", 0))
    seed = round_seed(int(cfg.get("seed", 0)), server_round)
    run = round_run(layout.crc, cfg.get("fleet-id", ""), server_round, layout.values_crc(values), seed)
    with board_lock(port, wait=timeout or None), FleetBoard(port, baud=baud) as fb:
        fb.connect(deadline)
        try:
            fb.check_plan(layout.crc)
        except PlanMismatch as e:
            # an answer, not an error: the server refuses it by the plan hash it names
            return Message(content=RecordDict({"fleet": _fleet_record(e.board_crc, port, time.monotonic() - t0,
                                                                      error=str(e))}), reply_to=msg)
        res = fb.train_round(layout, values, run, seed, epochs=int(cfg.get("local-epochs", 1)),
                             steps=int(cfg.get("local-steps", 0)), checkpoint_every=int(cfg.get("checkpoint-every", 0)),
                             deadline=deadline, log=lambda line: print(line, flush=True))
    metrics = {"num-examples": int(res.stored), "train-loss": float(res.loss)}
    if res.accuracy is not None:
        metrics["train-accuracy"] = float(res.accuracy)
    content = RecordDict({"arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in res.params.items()}),
                          "metrics": MetricRecord(metrics),
                          "fleet": _fleet_record(layout.crc, port, time.monotonic() - t0, res)})
    return Message(content=content, reply_to=msg)


def evaluate_message(msg, context, ports=None, baud=115200):
    """Federated evaluation: the global values on the board's own samples."""
    from flwr.app import Message, MetricRecord, RecordDict
    cfg, layout, values, port, timeout, t0 = _start(msg, context, ports)
    with board_lock(port, wait=timeout or None), FleetBoard(port, baud=baud) as fb:
        fb.connect(t0 + timeout if timeout else None)
        fb.check_plan(layout.crc)
        n, metric = fb.evaluate(layout, values)
    name = "eval-accuracy" if fb.board.facts["plan"]["ce"] else "eval-mse"
    return Message(content=RecordDict({"metrics": MetricRecord({"num-examples": int(n), name: float(metric)}),
                                       "fleet": _fleet_record(layout.crc, port, time.monotonic() - t0)}),
                   reply_to=msg)


def client_app(ports=None, baud=115200):
    """A ClientApp whose node k drives ports[k] (ports: a list, or a JSON file of one read at each
    message), or the port its node config names."""
    from flwr.clientapp import ClientApp
    app = ClientApp()

    @app.train()
    def train(msg, context):
        return train_message(msg, context, ports, baud)

    @app.evaluate()
    def evaluate(msg, context):
        return evaluate_message(msg, context, ports, baud)

    return app


def _deployed_app():
    try:
        return client_app()
    except ImportError:         # flwr not installed: the module still imports (docs, tests)
        return None


app = _deployed_app()
