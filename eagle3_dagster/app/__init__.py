"""The app layer: what a user runs. The `eagle3` command line (cli.py, one argparse tree), `eagle3 demo`
(demo.py) and `eagle3 ui` (ui.py), the local Dagster instance and SGLang endpoint they stand on
(instance.py), their stop on a signal (stop.py), `eagle3 check` (checkup.py) and the GPU lane's one-line
summary (smoke.py). It sits on top of every other layer; nothing below imports it.
"""
