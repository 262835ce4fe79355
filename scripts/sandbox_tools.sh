#!/bin/sh
# The sandbox battery (tests/sandbox/) needs bubblewrap. Install it where this machine allows it (root
# with apt-get, waiting on the dpkg lock like .ci/run), else say in one line that the battery will
# skip and what fixes it. Never fails the build: without bwrap those tests skip, they do not fail.
found() {
    command -v bwrap >/dev/null 2>&1 || [ -x /usr/bin/bwrap ] || [ -x /usr/local/bin/bwrap ] || [ -x /bin/bwrap ]
}
found && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing bubblewrap for the sandbox tests (apt-get install -y bubblewrap)"
    export DEBIAN_FRONTEND=noninteractive
    apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@" >/dev/null 2>&1; }
    # a fresh machine may have no package lists yet: update only when the plain install fails
    apt_get install -y -qq bubblewrap || { apt_get update -qq && apt_get install -y -qq bubblewrap; }
    found && exit 0
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo "
if command -v apt-get >/dev/null 2>&1; then
    fix="${sudo}apt-get install -y bubblewrap"
elif command -v dnf >/dev/null 2>&1; then
    fix="${sudo}dnf install -y bubblewrap"
else
    fix="install your distribution's bubblewrap package (it provides bwrap)"
fi
echo "NOTE: bubblewrap (bwrap) is not installed, so the sandbox battery (tests/sandbox) will skip; fix: $fix"
