#!/usr/bin/env bash
# Installs the Debian packages dptrain needs to build, test and run, when any is missing. Idempotent:
# when everything is present it only checks and returns.
set -euo pipefail

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
