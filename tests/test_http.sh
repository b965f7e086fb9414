#!/bin/sh
# pysbx serve --http as a client sees it, checked against docs/openapi.yaml.
exec /usr/bin/python3 "$(dirname "$0")/http_check.py" "$1" "$2"
