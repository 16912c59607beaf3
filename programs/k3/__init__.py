"""Kimi K3 decode: model configs (`config`), deterministic weights (`weights`) and the
numpy reference decoder (`reference`) the K3 programs are checked against bit for bit.
See docs/k3.md."""
