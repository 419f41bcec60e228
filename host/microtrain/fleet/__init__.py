"""Federated training of a fleet of boards on Flower (docs/fleet.md).

Each board keeps its samples on its own filesystem and trains on them; per round only the
plan's trainable values cross its serial link. One Flower ClientApp per board runs on the
host the board is plugged into (client.py), a Flower ServerApp averages them (server.py:
FedAvg by default, any flwr strategy), and sim.py runs the whole fleet on emulated boards in
Flower's simulation engine. flwr is an optional dependency: `pip install "microtrain[fleet]"`
(requirements-fleet.txt)."""
