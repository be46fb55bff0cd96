#!/usr/bin/env bash
# Idempotent set-up for the quick start and the tests.
#   scripts/setup.sh          a venv in .venv with launch and the training extras (torch, deepspeed, transformers)
#   scripts/setup.sh --test   also the test tools, Ray, and (as root) Debian's openssh-server, iproute2, chromium,
#                             podman and runc (made podman's default runtime by a drop-in file), docker.io (a dockerd
#                             per test host, started and stopped by tests/docker_fixture.py), slurm-wlm and munge,
#                             pdsh (the OpenSSH baseline of scripts/bench_fanout.py), prometheus (scrapes the dashboard)
# Torch comes from pip's configured index: on the dev/CI machines that is a local CPU build (torch 2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=.venv
extras=train
[[ $want_test == 1 ]] && extras=dev
stamp="$VENV/.installed-$extras-$(sha1sum pyproject.toml | cut -c1-12)"

APT_LOG=${TMPDIR:-/tmp}/launch-setup-apt.log
apt_pid=
if [[ $want_test == 1 && $(id -u) == 0 ]]; then
  missing=()
  command -v sshd >/dev/null || [[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v chromium >/dev/null || missing+=(chromium)
  command -v zsh >/dev/null || missing+=(zsh)    # the completion scripts run in each shell
  command -v fish >/dev/null || missing+=(fish)
  command -v podman >/dev/null || missing+=(podman)
  command -v runc >/dev/null || [[ -x /usr/sbin/runc ]] || missing+=(runc)
  # A real Docker daemon for the Docker tests: tests/docker_fixture.py starts one per test host and stops them.
  [[ -x /usr/sbin/dockerd ]] || missing+=(docker.io)
  # A real Slurm for the Slurm tests (tools/slurm.py starts and stops the daemons itself).
  [[ -x /usr/sbin/slurmctld && -x /usr/sbin/slurmd && -x /usr/bin/sbatch ]] || missing+=(slurm-wlm)
  [[ -x /usr/sbin/munged && -f /etc/munge/munge.key ]] || missing+=(munge)
  # The OpenSSH fan-out tool that scripts/bench_fanout.py measures launch against, on the same hosts.
  command -v pdsh >/dev/null || missing+=(pdsh)
  # A real Prometheus that scrapes `launch dashboard`'s /metrics in its test (the test starts it itself).
  command -v prometheus >/dev/null || missing+=(prometheus)
  if (( ${#missing[@]} )); then
    # Debian's packages install while pip fills the venv (in a fresh CI machine each takes a minute or more)
    echo "setup: apt-get install ${missing[*]} (log in $APT_LOG)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    } >"$APT_LOG" 2>&1 &
    apt_pid=$!
  fi
fi

# The extras through uv, which installs them in seconds where pip takes two minutes (about 200 packages), from
# where pip is configured to look (its indexes, find-links and constraints, as `pip config list` says them) and
# choosing as pip does among indexes; pip itself installs them if uv cannot.
uv_install() {
  "$VENV/bin/python" -m pip install uv || return 1
  local line key value
  while IFS= read -r line; do
    key=${line%%=*} value=${line#*=}
    value=${value#\'} value=${value%\'}
    case ${key##*.} in
      index-url) export UV_INDEX_URL=$value ;;
      extra-index-url) export UV_EXTRA_INDEX_URL=$value ;;
      find-links) export UV_FIND_LINKS=${value// /,} ;;
      constraint) export UV_CONSTRAINT=$value ;;
    esac
  done < <("$VENV/bin/python" -m pip config list 2>/dev/null)
  UV_INDEX_STRATEGY=unsafe-best-match "$VENV/bin/python" -m uv pip install --python "$VENV/bin/python" -e ".[$1]"
}

if [[ ! -x $VENV/bin/python ]]; then
  echo "setup: creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
if [[ ! -f $stamp && ! -f $VENV/.installed-dev-$(sha1sum pyproject.toml | cut -c1-12) ]]; then
  echo "setup: installing launch[$extras] (first time only; about a minute; log in $VENV/setup.log)"
  log="$VENV/setup.log"
  {
    "$VENV/bin/python" -m pip install --upgrade pip &&
    { "$VENV/bin/python" -c "import torch" 2>/dev/null || "$VENV/bin/python" -m pip install "torch==2.13.0"; } &&
    { uv_install "$extras" || "$VENV/bin/python" -m pip install -e ".[$extras]"; }
  } >"$log" 2>&1 || { tail -n 30 "$log"; echo "setup: pip install failed (full log: $log)" >&2; exit 1; }
  "$VENV/bin/python" -c "import launcher, torch" && touch "$stamp"
fi

if [[ -n $apt_pid ]]; then
  wait "$apt_pid" || { tail -n 30 "$APT_LOG"; echo "setup: apt-get install failed (full log: $APT_LOG)" >&2; exit 1; }
fi
if [[ $want_test == 1 && $(id -u) == 0 ]]; then
  # podman's default runtime, crun, fails on these machines' hybrid cgroups: runc, through a drop-in file
  "$VENV/bin/python" -c "from tools.container_image import RUNTIME_CONF, ensure_runtime_conf as ensure
if ensure(): print(f'setup: wrote {RUNTIME_CONF} (podman uses runc)')"
fi
