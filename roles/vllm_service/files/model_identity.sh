#!/usr/bin/env bash
# Prints "<digest>  <directory>" for each model under the service's home
# ($1): a hub model's revision (its refs), a copied model's file names, sizes
# and mtimes (hashing gigabytes of weights would stall every snapshot). The
# rollout's snapshot keeps it; a rollback compares it with what is there.
set -euo pipefail
home=$1
for model in "$home"/models/* "$home"/cache/huggingface/hub/models--*; do
  [ -d "$model" ] || continue
  if [ -d "$model/refs" ]; then
    digest=$(find "$model/refs" -type f -printf '%P ' -exec cat {} \; | LC_ALL=C sort | sha256sum)
  else
    digest=$(cd "$model" && find . -type f -printf '%p %s %T@\n' | LC_ALL=C sort | sha256sum)
  fi
  printf '%s  %s\n' "${digest%% *}" "$model"
done
