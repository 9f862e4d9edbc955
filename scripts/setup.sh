#!/usr/bin/env bash
# Installs the Debian packages dptrain needs to build, test and run, when any is missing. Idempotent:
# when everything is present it only checks and returns.
#   --bench  also install Debian's PyTorch (python3-torch, for /usr/bin/python3), the reference of
#            scripts/bench/train_bench.sh; about 230 MB installed with libtorch. CI does not pass it.
set -euo pipefail

BENCH=0
for arg in "$@"; do
  case $arg in
    --bench) BENCH=1 ;;
    -h | --help)
      echo "usage: $0 [--bench]   (--bench: also python3-torch for scripts/bench/train_bench.sh)"
      exit 0
      ;;
    *)
      echo "setup: unknown argument '$arg' (usage: $0 [--bench])" >&2
      exit 2
      ;;
  esac
done

PKGS=(
  build-essential cmake pkg-config
  libopenblas-dev                    # CPU GEMMs
  openmpi-bin libopenmpi-dev         # MPI backend, mpirun
  libgloo-dev                        # Gloo backend
  libcli11-dev libspdlog-dev libfmt-dev
  catch2                             # unit tests
  libtomlplusplus-dev nlohmann-json3-dev zlib1g-dev
  dataset-fashion-mnist              # the default data set (/usr/share/datasets/fashion-mnist)
  python3-numpy                      # tests only: reads our safetensors checkpoints with numpy alone
)
((BENCH == 0)) || PKGS+=(python3-torch) # the PyTorch DDP reference of the CPU training benchmark

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present"
fi
