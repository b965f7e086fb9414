#!/bin/sh
# Runs a test as pid 1 of a new pid namespace (with its own /proc), so that a
# sandbox escape in it cannot signal or flood the machine running the suite.
# Not root: inside a user namespace mapping us to root.
if [ "$(id -u)" -eq 0 ]; then
    exec unshare --pid --fork --mount-proc --kill-child "$@"
else
    exec unshare --user --map-root-user --pid --fork --mount-proc --kill-child "$@"
fi
