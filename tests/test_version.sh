#!/bin/sh
# Every file that names the project's version names this build's: the
# manifests' image tags (the image scripts/image builds is tagged with the
# .deb's version), the OpenAPI document, the man pages, the clients and the
# changelog's newest entry. A version raised in one place only fails here,
# not when a cluster cannot pull an image that was never built.
# usage: test_version.sh PATH/TO/pysbx SOURCE_DIR
set -eu
PYSBX=$1
SRC=$2
v=$("$PYSBX" --version | sed -n 's/^pysbx \([0-9][0-9.]*\)$/\1/p')
[ -n "$v" ] || { echo "FAIL pysbx --version says: $("$PYSBX" --version)"; exit 1; }
echo "version $v"
failed=0
want() { # want FILE PATTERN: FILE has a line matching PATTERN (a grep -E)
    if grep -Eq -- "$2" "$SRC/$1"; then
        echo "ok   $1"
    else
        echo "FAIL $1 does not name $v: $(grep -Eo -- "$3" "$SRC/$1" | head -1)"
        failed=1
    fi
}
V=$(printf '%s' "$v" | sed 's/\./\\./g')
want deploy/kubernetes/deployment.yaml "^ +image: localhost/pysbx:$V-bookworm\$" "image: .*"
want deploy/kubernetes/trixie/kustomization.yaml "newTag: $V-trixie\$" "newTag: .*"
want docs/openapi.yaml "^  version: $V\$" "^  version: .*"
want man/pysbx.1 "^\.TH .*\"pysbx $V\"" "\"pysbx [^\"]*\""
want man/libpysbx.3 "^\.TH .*\"pysbx $V\"" "\"pysbx [^\"]*\""
want clients/python/pyproject.toml "^version = \"$V\"\$" "^version = .*"
want clients/typescript/package.json "^  \"version\": \"$V\",\$" "\"version\": .*"
first=$(head -1 "$SRC/packaging/deb/changelog")
case $first in
"pysbx ($v) "*) echo "ok   packaging/deb/changelog" ;;
*) echo "FAIL packaging/deb/changelog's newest entry is not $v: $first"; failed=1 ;;
esac
exit $failed
