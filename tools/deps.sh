#!/bin/sh
# Installs the Debian packages that the build, the tests and the benchmarks need.
# As root it runs apt-get; otherwise it prints the one line to run.
PKGS="build-essential pkg-config clang libclang-rt-14-dev
libevent-dev libssl-dev libpq-dev libc-ares-dev libpg-query-dev libprotobuf-c-dev libinih-dev
postgresql-15 postgresql-client-15 pgbouncer openssl
python3 python3-pytest python3-psycopg gnuplot-nox procps"
missing=""
for p in $PKGS; do
	st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)
	case "$st" in
	*"ok installed"*) ;;
	*) missing="$missing $p" ;;
	esac
done
[ -z "$missing" ] && exit 0
echo "deps: missing:$missing"
if [ "$(id -u)" != 0 ]; then
	echo "deps: run as root: apt-get install -y$missing"
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq || exit 1
apt-get install -y -qq --no-install-recommends $missing || exit 1
