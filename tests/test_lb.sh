#!/bin/sh
# The load-balanced tests' short forms, three instances behind nginx, one
# SIGKILLed midway: every request answered exactly once; then sessions
# pinned by deploy/nginx/pysbx.conf, those of the surviving instances losing
# nothing and those of the killed one told session_lost once (bench/lb.py;
# the long forms are bench/lb.py with its defaults, and with --sessions 30
# --cells 20). Asserts nothing about time.
/usr/bin/python3 "$2/bench/lb.py" "$1" --requests 1000 --clients 6 --max-seconds 200 || exit $?
exec /usr/bin/python3 "$2/bench/lb.py" "$1" --sessions 12 --cells 10 --clients 4 --max-seconds 100
