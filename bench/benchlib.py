"""benchlib -- shared machinery of LokaDB's benchmarks (Python stdlib only).

* Cleanup: every process and temp dir is registered here and stopped/removed
  by PID at exit, also on failure, SIGTERM or Ctrl-C (try/finally + atexit).
* Postgres: a throw-away PostgreSQL 15 cluster on 127.0.0.1 (run as user
  postgres when we are root: PostgreSQL refuses to run as root).
* Pooler: one PgBouncer-compatible pooler process (Debian's PgBouncer, run as
  postgres when we are root, or lokadb, possibly with plugins) with its own
  ini, log and pidfile, and its admin console.
* pgbench runs, their summary output, and percentiles from the
  per-transaction logs (`--log`, latency in microseconds is column 3).
* Suite plumbing shared by run.py, parity.py, routing_cost.py and site.py:
  interleaved rounds, idle CPU, abort handling, report header facts, error
  and pooler log sections, output paths, charts, writing the reports.
"""

import atexit
import datetime
import glob
import math
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PG_BIN = Path(os.environ.get("BENCH_PG_BIN", "/usr/lib/postgresql/15/bin"))
PGBOUNCER_BIN = os.environ.get("BENCH_PGBOUNCER", "/usr/sbin/pgbouncer")
IS_ROOT = os.geteuid() == 0


REPO = Path(__file__).resolve().parent.parent


def shown_path(text):
    """A text for a report: paths inside the repository relative to it, and
    the run's temp dirs as <tmp>, so reports do not carry this machine's paths."""
    text = str(text).replace(str(REPO) + "/", "")
    return re.sub(r"%s/lokadb-[A-Za-z0-9_.-]+" % re.escape(tempfile.gettempdir()), "<tmp>", text)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------
# cleanup registry
# --------------------------------------------------------------------------

_cleanups = []          # (name, fn), run last-registered first
_cleaning = False


def on_cleanup(name, fn):
    _cleanups.append((name, fn))


def cleanup():
    """Stop every registered process and remove every temp dir (idempotent).

    Each registered function runs once (it is taken off the list first), so a
    second call only does what is left; one benchmark suite may clean up and
    the next one register new processes and clean them up in turn."""
    global _cleaning
    if _cleaning:
        return
    _cleaning = True
    # A second Ctrl-C during cleanup must not leave processes behind.
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        while _cleanups:
            name, fn = _cleanups.pop()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 -- keep cleaning up
                print(f"cleanup of {name} failed: {e!r}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGINT, old)
        _cleaning = False


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def install_cleanup_handlers():
    atexit.register(cleanup)
    # Started in the background by a non-interactive shell, SIGINT arrives
    # ignored; Ctrl-C / kill -INT must still stop the run and clean up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGHUP, _on_sigterm)


# --------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------

def pid_alive(pid):
    """True if pid runs and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_gone(pid, timeout, popen=None):
    deadline = time.monotonic() + timeout
    while True:
        # a child of ours is gone once reaped (its exit code is then known);
        # looking at /proc alone would return between its exit and the reaping
        if popen is not None:
            if popen.poll() is not None:
                return True
        elif not pid_alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def stop_pid(pid, sig=signal.SIGTERM, timeout=10.0, popen=None):
    """Send sig to pid, wait up to timeout, then SIGKILL. Returns True if sig sufficed."""
    if pid is None or not pid_alive(pid):
        if popen is not None:
            popen.poll()
        return True
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return True
    if wait_gone(pid, timeout, popen):
        return True
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    wait_gone(pid, 5.0, popen)
    return False


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_ids():
    pw = pwd.getpwnam("postgres")
    return pw.pw_uid, pw.pw_gid


def as_pg(cmd):
    """cmd run as user postgres when we are root."""
    if IS_ROOT:
        return ["runuser", "-u", "postgres", "--"] + list(cmd)
    return list(cmd)


def chown_pg(path):
    if IS_ROOT:
        os.chown(path, *pg_ids())


def client_env(extra=None):
    """Environment for libpq clients: no inherited PG* variables, no TLS
    unless extra (variables added last, e.g. {"PGSSLMODE": "require"}) says so."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGCONNECT_TIMEOUT"] = "10"
    env["PGSSLMODE"] = "disable"
    env["PGGSSENCMODE"] = "disable"
    env.update(extra or {})
    return env


def env_int(name, default, minimum=0):
    """The integer in environment variable name (default when unset or empty);
    exits with a message when it is not an integer >= minimum."""
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    if not v.isdigit() or int(v) < minimum:
        sys.exit(f"{name} must be an integer >= {minimum}, not {v!r}")
    return int(v)


def make_tempdir(prefix):
    """A temp dir removed at cleanup; traversable by user postgres."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o755)
    if os.environ.get("BENCH_KEEP_TMP"):
        on_cleanup(f"keep {d}", lambda: print(f"BENCH_KEEP_TMP: kept {d}", file=sys.stderr))
    else:
        on_cleanup(f"remove {d}", lambda: shutil.rmtree(d, ignore_errors=True))
    return d


def tail(path, n=40):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def first_line(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (r.stdout or r.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------

class Postgres:
    """A throw-away PostgreSQL cluster under base/, on 127.0.0.1:port, trust auth."""

    def __init__(self, base, settings):
        self.base = Path(base)
        self.datadir = self.base / "pgdata"
        self.sockdir = self.base / "pgsock"
        self.logpath = self.base / "postgres.log"
        self.port = free_port()
        self.host = "127.0.0.1"
        self.settings = settings
        self.pid = None

    def start(self):
        for d in (self.datadir, self.sockdir):
            d.mkdir(mode=0o700)
            chown_pg(d)
        self.logpath.touch()
        chown_pg(self.logpath)
        r = subprocess.run(as_pg([str(PG_BIN / "initdb"), "-D", str(self.datadir),
                                  "--auth=trust", "-U", "postgres", "--no-sync",
                                  "-E", "UTF8", "--locale=C"]),
                           capture_output=True, text=True, timeout=300, cwd=str(self.base))
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{r.stdout}\n{r.stderr}")
        conf = dict(self.settings)
        conf.update({"listen_addresses": "'127.0.0.1'", "port": str(self.port),
                     "unix_socket_directories": f"'{self.sockdir}'"})
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write("\n# added by bench/benchlib.py\n")
            for k, v in conf.items():
                f.write(f"{k} = {v}\n")
        (self.datadir / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n")
        chown_pg(self.datadir / "pg_hba.conf")
        # Register the stop before starting: a Ctrl-C during pg_ctl must not leak it.
        on_cleanup("postgres", self.stop)
        r = subprocess.run(as_pg([str(PG_BIN / "pg_ctl"), "-D", str(self.datadir),
                                  "-l", str(self.logpath), "-w", "-t", "120", "start"]),
                           capture_output=True, text=True, timeout=180, cwd=str(self.base))
        self._read_pid()
        if r.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed:\n{r.stdout}\n{r.stderr}\n"
                               f"{tail(self.logpath)}")
        if self.pid is None:
            raise RuntimeError("postgres started but postmaster.pid is unreadable")

    def _read_pid(self):
        try:
            self.pid = int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            pass

    def stop(self):
        if self.pid is None:
            self._read_pid()
        if self.pid is not None:
            # SIGINT is PostgreSQL's fast shutdown.
            stop_pid(self.pid, signal.SIGINT, 60.0)
            self.pid = None

    def alive(self):
        return self.pid is not None and pid_alive(self.pid)

    def psql(self, sql, dbname="postgres", port=None, timeout=300, host=None, env=None):
        """Run SQL with psql as postgres over TCP (or the unix socket directory
        host); returns stdout (raises on error). env: client_env's extra variables."""
        r = subprocess.run([str(PG_BIN / "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
                            "-h", host or self.host, "-p", str(port or self.port), "-U", "postgres",
                            "-d", dbname, "-c", sql],
                           capture_output=True, text=True, timeout=timeout, env=client_env(env))
        if r.returncode != 0:
            raise RuntimeError(f"psql -c {sql!r} failed: {r.stderr.strip()}")
        return r.stdout.strip()


def psql_dicts(pg, sql, dbname="postgres", port=None, timeout=60, host=None, env=None):
    """Rows of one statement as dicts by column name (text values, NULL as None),
    run with psql as postgres over TCP or the unix socket directory host
    (raises on error). env: client_env's extra variables."""
    r = subprocess.run([str(PG_BIN / "psql"), "-X", "-q", "-A", "-F", "\x1f", "-R", "\x1e",
                        "-P", "null=\x1d", "-P", "footer=off", "-v", "ON_ERROR_STOP=1",
                        "-h", host or pg.host, "-p", str(port or pg.port), "-U", "postgres",
                        "-d", dbname, "-c", sql],
                       capture_output=True, text=True, timeout=timeout, env=client_env(env))
    if r.returncode != 0:
        raise RuntimeError(f"psql -c {sql!r} failed: {r.stderr.strip()}")
    recs = [x for x in r.stdout.rstrip("\n").split("\x1e") if x.strip("\n")]
    if not recs:
        return []
    cols = recs[0].strip("\n").split("\x1f")
    rows = []
    for rec in recs[1:]:
        vals = rec.strip("\n").split("\x1f")
        rows.append({c: (None if v == "\x1d" else v) for c, v in zip(cols, vals)})
    return rows


# --------------------------------------------------------------------------
# poolers
# --------------------------------------------------------------------------

class Pooler:
    """One pooler process (PgBouncer or lokadb) with its own ini, log and pidfile.

    kind: "pgbouncer" or a name starting with it ("pgbouncer_tls"): a PgBouncer
    process (run as user postgres when root: PgBouncer refuses root); any other
    name is a lokadb process ("lokadb", "lokadb_noop", "lokadb_control"). It
    names the process's directory under base and its files.  settings go into
    the [lokadb] / [pgbouncer] section (e.g. plugins and plugin_dir).

    port: the TCP port (default a free one; several so_reuseport processes
    share one).  own_socket: the process also listens on a unix socket in its
    own directory, and the start check and the console use that socket, so
    they reach this very process even when others share its TCP port.
    client_env: extra libpq variables for the start check and the console
    over TCP (e.g. {"PGSSLMODE": "require"} when the pooler requires TLS).
    proc_env: extra environment variables of the pooler process itself
    (e.g. {"LOKADB_MUX_WINDOW_KB": "1024"})."""

    def __init__(self, kind, binary, base, pg, dbname, settings, sections=None, port=None,
                 own_socket=False, client_env=None, proc_env=None):
        self.kind = kind
        self.is_pgbouncer = kind.startswith("pgbouncer")
        self.sections = sections or {}   # extra ini sections: {"plugin.x": {key: value}}
        self.binary = binary
        self.dir = Path(base) / kind
        self.pg = pg
        self.dbname = dbname
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.own_socket = own_socket
        self.client_env = client_env
        self.proc_env = proc_env or {}   # extra environment of the pooler process
        self.settings = settings
        self.ini = self.dir / f"{kind}.ini"
        self.logfile = self.dir / f"{kind}.log"
        self.stderr_path = self.dir / f"{kind}.stderr"
        self.pidfile = self.dir / f"{kind}.pid"
        self.popen = None
        self.pid = None
        self.as_postgres = self.is_pgbouncer and IS_ROOT

    @property
    def section(self):
        return "pgbouncer" if self.is_pgbouncer else "lokadb"

    @property
    def console_db(self):
        return "pgbouncer" if self.is_pgbouncer else "lokadb"

    def _via(self):
        """(host, env) that reach this process: its unix socket directory, or TCP."""
        if self.own_socket:
            return str(self.dir), None
        return self.host, self.client_env

    def write_files(self):
        self.dir.mkdir(mode=0o755)
        (self.dir / "userlist.txt").write_text('"postgres" ""\n')
        s = {
            "listen_addr": self.host,
            "listen_port": self.port,
            "unix_socket_dir": str(self.dir) if self.own_socket else "",
            "auth_type": "trust",
            "auth_file": str(self.dir / "userlist.txt"),
            "admin_users": "postgres",
            "logfile": str(self.logfile),
            "pidfile": str(self.pidfile),
        }
        s.update(self.settings)
        lines = [f"[{self.section}]"] + [f"{k} = {v}" for k, v in s.items()]
        lines += ["", "[databases]",
                  f"{self.dbname} = host={self.pg.host} port={self.pg.port} dbname={self.dbname}",
                  ""]
        for name, kv in self.sections.items():
            lines += [f"[{name}]"] + [f"{k} = {v}" for k, v in kv.items()] + [""]
        self.ini.write_text("\n".join(lines))
        for p in (self.logfile, self.stderr_path):
            p.touch()
        if self.as_postgres:
            for p in (self.dir, self.ini, self.dir / "userlist.txt", self.logfile):
                chown_pg(p)

    def start(self, timeout=30.0):
        self.write_files()
        cmd = [self.binary, "-q", str(self.ini)]
        if self.as_postgres:
            cmd = as_pg(cmd)
        self.cmd = cmd
        with open(self.stderr_path, "ab") as err:
            self.popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                          cwd=str(self.dir), start_new_session=True,
                                          env=client_env(self.proc_env))
        on_cleanup(self.kind, self.stop)
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.popen.returncode} at start:\n"
                                   f"{tail(self.stderr_path)}\n{tail(self.logfile)}")
            if self.pid is None:
                self._read_pid()
            host, env = self._via()
            try:
                self.pg.psql("select 1", dbname=self.dbname, port=self.port, timeout=15,
                             host=host, env=env)
                if self.pid is None:
                    self._read_pid()
                return
            except (RuntimeError, subprocess.SubprocessError) as e:
                last = e
            time.sleep(0.2)
        raise RuntimeError(f"{self.kind} did not accept a query within {timeout}s: {last}\n"
                           f"{tail(self.logfile)}")

    def console_dicts(self, sql):
        """A console command's rows as dicts by column name (values as text, NULL as None)."""
        host, env = self._via()
        return psql_dicts(self.pg, sql, self.console_db, self.port, host=host, env=env)

    def console(self, sql):
        """Run a console command (database lokadb / pgbouncer, as the admin user
        postgres); returns psql's unaligned output, columns separated by |."""
        host, env = self._via()
        return self.pg.psql(sql, dbname=self.console_db, port=self.port, timeout=30,
                            host=host, env=env)

    def _read_pid(self):
        try:
            self.pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            if not self.as_postgres and self.popen is not None:
                self.pid = self.popen.pid   # lokadb runs in the foreground: same process

    def cpu_seconds(self):
        return proc_cpu_seconds(self.pid) if self.pid is not None else None

    def alive(self):
        if self.popen is None or self.popen.poll() is not None:
            return False
        return self.pid is None or pid_alive(self.pid)

    def stop(self):
        """Immediate shutdown by PID; the graceful signal first, SIGKILL after 10 s."""
        if self.popen is None:
            return
        if self.pid is None:
            self._read_pid()
        # PgBouncer 1.18: SIGTERM = immediate shutdown. lokadb: SIGTERM = wait for
        # clients (there are none left at this point), SIGQUIT = now.
        sig = signal.SIGTERM
        ok = True
        if self.pid is not None and self.pid != self.popen.pid:
            ok = stop_pid(self.pid, sig, 10.0)
        ok = stop_pid(self.popen.pid, sig, 10.0, self.popen) and ok
        self.stopped_cleanly = ok
        self.popen = None

    def exit_info(self):
        rc = self.popen.poll() if self.popen is not None else None
        return f"{self.kind} pid {self.pid} exit status {rc}"


# --------------------------------------------------------------------------
# pgbench
# --------------------------------------------------------------------------

class PgbenchResult:
    def __init__(self):
        self.ok = False
        self.error = None
        self.cmd = None
        self.output = ""
        self.transactions = 0
        self.failed = 0
        self.tps = None
        self.elapsed = None
        self.latencies_us = []


def parse_pgbench_output(out, res):
    m = re.search(r"number of transactions actually processed: (\d+)", out)
    if m:
        res.transactions = int(m.group(1))
    m = re.search(r"number of failed transactions: (\d+)", out)
    if m:
        res.failed = int(m.group(1))
    m = re.search(r"^tps = ([0-9.]+)", out, re.M)
    if m:
        res.tps = float(m.group(1))
        if res.tps > 0:
            res.elapsed = res.transactions / res.tps


def read_latencies(prefix, cycle=False):
    """Latencies in microseconds from pgbench's per-transaction logs (removed after).

    Log lines are "client_id transaction_no time script_no time_epoch time_us".
    cycle=False: column 3, the transaction's own latency.  pgbench starts that
    clock after connecting, so under -C it leaves out connect, login and
    disconnect.  cycle=True: the time between the ends of a client's
    consecutive transactions, i.e. the whole request cycle (under -C:
    disconnect + connect + login + the transaction); each client's first
    transaction has no predecessor and is left out."""
    lat = []
    ends = {}
    files = sorted(glob.glob(glob.escape(str(prefix)) + ".*"))
    for fn in files:
        with open(fn) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 6 or not parts[2].isdigit():
                    continue          # failed/skipped transaction
                if cycle:
                    end = int(parts[4]) * 1000000 + int(parts[5])
                    ends.setdefault(parts[0], []).append((int(parts[1]), end))
                else:
                    lat.append(int(parts[2]))
        os.unlink(fn)
    for seq in ends.values():
        seq.sort()
        lat.extend(b[1] - a[1] for a, b in zip(seq, seq[1:]))
    return lat


def proc_cpu_seconds(pid):
    """user + system CPU seconds used so far by pid (None if unreadable)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _tree_stats(pid):
    """(pid, fields of /proc/pid/stat after the command) of pid and its
    children (a postmaster and its backends)."""
    pid = str(pid)
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if p == pid or f[1] == pid:
            yield p, f


def tree_pids(pid):
    """pid and its children's pids, as strings."""
    return [p for p, _ in _tree_stats(pid)]


def tree_cpu_seconds(pid):
    """user + system CPU seconds of pid and its children (a postmaster and its
    backends), from /proc."""
    return sum(int(f[11]) + int(f[12]) for _, f in _tree_stats(pid)) / os.sysconf("SC_CLK_TCK")


def run_pgbench(args, host, port, dbname, seconds, logprefix=None, cwd=None, timeout_extra=60,
                cycle=False, env=None):
    """Run pgbench for `seconds`; returns a PgbenchResult (never raises on pgbench errors).
    env: extra libpq variables (see client_env), e.g. {"PGSSLMODE": "require"}."""
    res = PgbenchResult()
    cmd = [str(PG_BIN / "pgbench"), "-h", host, "-p", str(port), "-U", "postgres", "-n",
           "-T", str(seconds)] + list(args)
    if logprefix is not None:
        cmd += ["--log", f"--log-prefix={logprefix}"]
    cmd.append(dbname)
    res.cmd = cmd
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=cwd, env=client_env(env))
    try:
        out, _ = p.communicate(timeout=seconds + timeout_extra)
    except subprocess.TimeoutExpired:
        stop_pid(p.pid, signal.SIGINT, 5.0, p)
        out, _ = p.communicate()
        res.output = out
        res.error = f"pgbench did not finish within {seconds + timeout_extra}s (hang?)"
        return res
    except BaseException:
        stop_pid(p.pid, signal.SIGTERM, 2.0, p)
        raise
    res.output = out
    parse_pgbench_output(out, res)
    if logprefix is not None:
        res.latencies_us = read_latencies(logprefix, cycle)
    if p.returncode != 0:
        res.error = f"pgbench exited with status {p.returncode}"
    elif res.failed:
        res.error = f"pgbench reported {res.failed} failed transactions"
    elif res.tps is None or res.transactions == 0:
        res.error = "pgbench printed no tps / processed no transactions"
    else:
        res.ok = True
    return res


# Student's t, two-sided 95 %, by degrees of freedom (1.96 beyond the table)
T95 = [None, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
       2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086]


def interval95(values):
    """(mean, low, high): the 95 % confidence interval of the mean of
    per-round values (Student's t); None with fewer than two values. Rounds
    are interleaved, so a value is a paired comparison of two targets that
    ran one after the other (a ratio of their rates, a difference of their
    latencies): what the machine did meanwhile hits both."""
    v = [x for x in values if x is not None]
    n = len(v)
    if n < 2:
        return None
    m = sum(v) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1))
    h = (T95[n - 1] if n - 1 < len(T95) else 1.96) * sd / math.sqrt(n)
    return m, m - h, m + h


def percentile(sorted_vals, p):
    """Nearest-rank percentile of a sorted list (p in 0..100)."""
    if not sorted_vals:
        return None
    k = max(1, math.ceil(p / 100.0 * len(sorted_vals)))
    return sorted_vals[min(k, len(sorted_vals)) - 1]


# --------------------------------------------------------------------------
# suite plumbing: what every suite does around its measurements
# --------------------------------------------------------------------------

# PostgreSQL settings of the benchmark clusters (a suite may start from these).
PG_SETTINGS = {
    "max_connections": "300",
    "shared_buffers": "256MB",
    "fsync": "off",
    "synchronous_commit": "off",
    # Keep checkpoints out of the measured runs (an explicit CHECKPOINT runs
    # before every row instead).
    "max_wal_size": "4GB",
    "checkpoint_timeout": "30min",
    "log_min_messages": "warning",
}

NOTABLE_LOG_LINE = re.compile(r"\b(warning|error|fatal|panic|assert|sanitizer|segv)", re.I)


def idle_cpu(poolers, seconds=2.0):
    """Cores each pooler uses while nothing runs (over `seconds`): an idle
    pooler should use no CPU, so busy loops show before measuring. Poolers
    whose CPU time is unreadable are left out."""
    c0 = {k: p.cpu_seconds() for k, p in poolers.items()}
    time.sleep(seconds)
    out = {}
    for k, p in poolers.items():
        c1 = p.cpu_seconds()
        if c0[k] is not None and c1 is not None:
            out[k] = (c1 - c0[k]) / seconds
    return out


def stop_and_read_pooler_logs(poolers):
    """Stop the poolers (so shutdown messages are logged); for each, the count
    of its log and stderr lines and the lines besides routine ones."""
    logs = {}
    for kind, p in poolers.items():
        p.stop()
        lines = []
        for path in (p.logfile, p.stderr_path):
            try:
                lines += path.read_text(errors="replace").splitlines()
            except OSError:
                pass
        logs[kind] = (len(lines), [x for x in lines if NOTABLE_LOG_LINE.search(x)])
    return logs


def error_entry(target, row, msg, res=None, pooler=None, cmd_prefix="", show=str):
    """An error of a run for a report's Errors section: the pgbench command and
    the end of its output (res), the pooler's state and log tails (pooler)."""
    err = {"target": target, "row": row, "message": msg}
    if res is not None:
        err["cmd"] = cmd_prefix + show(" ".join(shlex.quote(a) for a in res.cmd))
        err["output"] = show("\n".join(res.output.strip().splitlines()[-25:]))
    if pooler is not None:
        err["process"] = pooler.exit_info() if pooler.popen is not None else f"{pooler.kind} not running"
        err["log"] = tail(pooler.logfile, 40)
        err["stderr"] = tail(pooler.stderr_path, 20)
    return err


def shutdown_errors(poolers):
    """Error entries for the poolers that SIGTERM did not stop within 10 s."""
    return [{"target": kind, "row": "shutdown",
             "message": f"{p.kind} did not exit within 10 s of SIGTERM (killed)",
             "log": tail(p.logfile, 20)}
            for kind, p in poolers.items() if getattr(p, "stopped_cleanly", True) is False]


def error_lines(errors, show=str, label=str, blank_before=True):
    """The "## Errors" section of a report (nothing without errors); show()
    turns each text into what the report prints (e.g. shown_path), label()
    each target into its name."""
    L = []
    if errors:
        if blank_before:
            L.append("")
        L.append("## Errors")
        for e in errors:
            L.append("")
            L.append(f"- {label(e['target'])} {e['row'] or ''}: {show(e['message'])}")
            for key in ("cmd", "process"):
                if e.get(key):
                    L.append(f"  - {key}: `{show(e[key])}`")
            for key in ("output", "log", "stderr"):
                if e.get(key):
                    L.append(f"  - {key}:")
                    L.append("")
                    L.append("    ```")
                    L.extend("    " + show(x) for x in e[key].splitlines())
                    L.append("    ```")
    return L


def pooler_log_lines(logs, label):
    """What the poolers' logs said (logs: (kind, (lines, notable lines)) pairs),
    for a report; label(kind) names the pooler."""
    L = []
    if logs:
        L.append("Pooler logs (log_connections, log_disconnections and log_stats off): " + "; ".join(
            f"{label(k)} {n} line(s), {len(bad)} warning/error line(s)" for k, (n, bad) in logs))
        for k, (n, bad) in logs:
            if bad:
                L += ["", f"{label(k)} warnings/errors (first 10):", "", "```"] + bad[:10] + ["```"]
        L.append("")
    return L


def output_paths(o, now, name, results, ext=".md", only_one=False):
    """Where a suite's report (ext ".md") or chart goes: --output as given when
    it is the only report, else NAME added to its stem; without --output,
    RESULTS/NAME-quick or RESULTS/NAME plus a dated copy."""
    if o.output:
        out = Path(o.output)
        if only_one:
            return [out.with_suffix(ext) if ext != ".md" else out]
        suffix = (out.suffix or ".md") if ext == ".md" else ext
        return [out.with_name(f"{out.stem}-{name}{suffix}")]
    if o.quick:
        return [results / f"{name}-quick{ext}"]
    return [results / f"{name}{ext}", results / f"{name}-{now.strftime('%Y%m%d')}{ext}"]


def run_bench(bench, what, steps, tail_lines=30):
    """Run steps() (setup and measurements) with the suites' failure handling.

    Returns (130, None) after Ctrl-C/SIGTERM (everything already cleaned up),
    (None, exception) when the run aborted (logged, with the poolers' log
    tails; the caller decides what is left to report), else (None, None)."""
    try:
        steps()
    except KeyboardInterrupt:
        log("interrupted; stopping everything")
        cleanup()
        return 130, None
    except Exception as e:  # noqa: BLE001 -- report what there is, clean up, fail
        log(f"{what} aborted: {e}")
        for p in bench.poolers.values():
            log(f"--- {p.kind} log tail ---\n{tail(p.logfile, tail_lines)}")
        return None, e
    return None, None


def report_meta(R, now, load_before, versions):
    """The header facts of a report: load, date, versions, command line, machine."""
    meta = {"load_before": f"{load_before:.2f}", "load_after": f"{os.getloadavg()[0]:.2f}",
            "date": now.strftime("%Y-%m-%d %H:%M UTC"), "versions": versions,
            "command": R.command_line()}
    meta["nproc"], meta["model"], meta["mem"], meta["kernel"] = R.machine_info()
    return meta


def draw_chart(draw, pngs, notes):
    """draw(png) makes the chart (None, or why it could not); it is copied to
    the other paths of pngs. Returns the chart's file name, or None with the
    reason added to notes."""
    try:
        why = draw(pngs[0])
    except (OSError, subprocess.SubprocessError) as e:
        why = f"gnuplot failed: {e}"
    if why:
        notes.append(f"no chart: {why}")
        return None
    for p in pngs[1:]:
        shutil.copy2(pngs[0], p)
    return pngs[0].name


def write_reports(reports, also=()):
    """reports: (text, paths) pairs. Writes each text to its paths, prints it,
    and logs every file written (also: files written before, e.g. charts)."""
    written = []
    for text, paths in reports:
        for p in paths:
            p.write_text(text)
            written.append(p)
        print()
        print(text)
    written += list(also)
    log("wrote " + ", ".join(str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)
                             for p in written))


def private_lokadb_copy(src, base):
    """Copy the lokadb binary src into base (a `make` elsewhere may replace it
    mid-run); returns (the copy's path, the report's description of src)."""
    src = Path(src)
    st = src.stat()
    shown = f"./{src.relative_to(REPO)}" if src.is_relative_to(REPO) else str(src)
    desc = (f"`{shown}` ({st.st_size} bytes, built "
            f"{datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC)")
    copy = str(Path(base) / "lokadb-bin")
    shutil.copy2(src, copy)
    return copy, desc


# --------------------------------------------------------------------------
# interleaved rounds
# --------------------------------------------------------------------------

def split_seconds(total, rounds):
    base, extra = divmod(total, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


def rotate(lst, n):
    n %= len(lst)
    return lst[n:] + lst[:n]


def round_order(targets, idx, r):
    """The order of the targets in round r (-1: the warm-up) of row idx.

    What a run leaves behind (tens of thousands of TIME_WAIT sockets after a
    connect-per-request run, dirty pages after updates) slows the run right
    after it, so every target must follow every other one equally often.
    Two targets alternate (A B, B A, A B, ...: each follows the other, and
    itself, equally often). With three or more, the first target (the
    reference: direct, plugins off) stays first and the others run in order
    and reversed in turn: D A B, D B A, ... makes A and B follow D, each
    other and D follow each of them equally often over two rounds (a plain
    rotation D A B, A B D, B D A put B right after A in two rounds of three).
    Rows start on alternate orders, so an odd number of rounds evens out over
    the rows of a suite."""
    if len(targets) <= 2:
        return rotate(targets, idx + r)
    rest = targets[1:]
    return [targets[0]] + (rest if (idx + r) % 2 == 0 else rest[::-1])


def run_rounds(targets, idx, warmup, seconds, rounds, cells, run_one, down, prefix, log_round):
    """One row: a warm-up run per target, then `rounds` measured rounds of
    split_seconds(seconds, rounds), the targets in round_order(), so that
    each target runs as often right after each other one.

    run_one(target, seconds, logprefix, label) -> result or None (failed);
    down(target): the target is down (its failed warm-up is not an error of
    the cell); prefix(target, round): the pgbench log prefix; log_round(target,
    round, result, sorted latencies) logs a measured round. Failures go to
    cells[target].errors; later rounds skip a failed cell."""
    if warmup > 0:
        for t in round_order(targets, idx, -1):
            if run_one(t, warmup, None, "warm-up") is None and not down(t):
                cells[t].errors.append("warm-up failed")
    for r, secs in enumerate(split_seconds(seconds, rounds)):
        for t in round_order(targets, idx, r):
            if cells[t].errors:
                continue
            res = run_one(t, secs, str(prefix(t, r)), f"round {r + 1}/{rounds}")
            if res is None:
                cells[t].errors.append("run failed")
                continue
            cells[t].add(res)
            log_round(t, r, res, sorted(res.latencies_us))
