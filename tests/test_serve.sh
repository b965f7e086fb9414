#!/bin/sh
# pysbx serve (stdin and a UNIX socket) and pysbx batch, as a client sees them.
exec /usr/bin/python3 "$(dirname "$0")/serve_check.py" "$1"
