#!/bin/sh
# The load-balanced test's short form: three instances behind nginx, one
# SIGKILLed midway, every request answered exactly once (bench/lb.py; the
# long form is bench/lb.py with its defaults). Asserts nothing about time.
exec /usr/bin/python3 "$2/bench/lb.py" "$1" --requests 1000 --clients 6 --max-seconds 200
