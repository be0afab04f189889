#!/usr/bin/env bash
# The versions of a model copied from the controller. The instances serve DIR
# (<home>/models/<name>), a link to one version, <home>/models/.versions/
# <name>@<digest>: a new model is staged beside the one that serves, before
# any drain, and the link is switched in one rename (in the drained window);
# a rollback points it back; prune removes what nothing names.
#
#   model_version.sh adopt  DIR VERSION DIGEST OLD_STAMP OWNER GROUP [--check]
#       DIR a directory (a copy an older role made in place): it becomes a
#       version, VERSION itself when OLD_STAMP says it holds the controller's
#       model of DIGEST, else <name>@in-place-<time>; DIR links to it.
#       Prints "ok", "moved <version>" or, with --check, "would-move <version>".
#   model_version.sh link   DIR VERSION DIGEST OLD_STAMP [--check]
#       DIR links to VERSION (atomically: a new link renamed over the old).
#       Prints "ok", "switched <old>" or, with --check, "would-switch <old>".
#   model_version.sh prune  MODELS_DIR SNAPSHOT_ROOT...
#       Removes every version in MODELS_DIR/.versions that no link in
#       MODELS_DIR and no snapshot's model-links (under a SNAPSHOT_ROOT) names. Prints "removed <v>"
#       for each.
set -euo pipefail

listing() {  # the digest of a copy's files, as tasks/model_path.yml reads it (names, sizes, times)
  find "$1" -type f -printf '%P\t%s\t%T@\n' | LC_ALL=C sort | sha256sum | cut -d' ' -f1
}

# Where adopt puts a directory copied in place: VERSION if it is what the old stamp says it is.
adopted_as() {
  local dir=$1 version=$2 digest=$3 old_stamp=$4
  if [ ! -e "$version" ] && [ "$(cat "$old_stamp" 2>/dev/null || true)" = "$digest $(listing "$dir")" ]; then
    printf '%s\n' "$version"
  else
    printf '%s@in-place-%s\n' "$(dirname "$version")/$(basename "$dir")" "$(date -u +%Y%m%dT%H%M%SZ)"
  fi
}

action=${1:?usage: model_version.sh adopt|link|prune ...}
shift
case $action in
  adopt)
    dir=$1 version=$2 digest=$3 old_stamp=$4 owner=$5 group=$6 check=${7:-}
    if [ -L "$dir" ] || [ ! -e "$dir" ]; then echo ok; exit 0; fi
    [ -d "$dir" ] || { echo "$dir is neither a directory nor a link" >&2; exit 1; }
    target=$(adopted_as "$dir" "$version" "$digest" "$old_stamp")
    if [ "$check" = --check ]; then echo "would-move $target"; exit 0; fi
    versions=$(dirname "$version")
    mkdir -p "$versions"
    chown "$owner:$group" "$versions"
    chmod 0750 "$versions"
    mv -T "$dir" "$target"
    ln -s "$target" "$dir"
    if [ "$target" = "$version" ]; then
      printf '%s %s\n' "$digest" "$(listing "$version")" > "$version.stamp"
      chmod 0600 "$version.stamp"
    fi
    rm -f "$old_stamp"
    echo "moved $target"
    ;;
  link)
    dir=$1 version=$2 digest=$3 old_stamp=$4 check=${5:-}
    if [ -L "$dir" ]; then
      current=$(readlink "$dir")
      if [ "$current" = "$version" ]; then echo ok; exit 0; fi
    elif [ -d "$dir" ]; then
      # Only in check mode: adopt has not moved it yet. It serves VERSION afterwards when adopt takes it as VERSION.
      if [ "$(adopted_as "$dir" "$version" "$digest" "$old_stamp")" = "$version" ]; then echo ok; else echo "would-switch $dir"; fi
      exit 0
    else
      current=none
    fi
    if [ "$check" = --check ]; then echo "would-switch $current"; exit 0; fi
    [ -d "$version" ] || { echo "$version is not staged: nothing to link $dir to" >&2; exit 1; }
    tmp="$dir.switch.$$"
    ln -s "$version" "$tmp"
    mv -T "$tmp" "$dir"
    echo "switched $current"
    ;;
  prune)
    models=$1
    shift
    [ -d "$models/.versions" ] || exit 0
    keep=()
    for link in "$models"/*; do
      if [ -L "$link" ]; then keep+=("$(readlink "$link")"); fi
    done
    for root in "$@"; do
      for named in "$root"/*/model-links "$root"/model-links; do
        if [ -s "$named" ]; then
          while IFS=$'\t' read -r _ target; do keep+=("$target"); done < "$named"
        fi
      done
    done
    for version in "$models/.versions"/*; do
      [ -e "$version" ] || continue
      base=${version%.stamp}
      wanted=no
      for kept in "${keep[@]}"; do
        if [ "$kept" = "$base" ]; then wanted=yes; fi
      done
      if [ $wanted = no ]; then
        rm -rf "$version"
        case $version in *.stamp) ;; *) echo "removed $version" ;; esac
      fi
    done
    ;;
  *)
    echo "model_version.sh: unknown action $action" >&2
    exit 2
    ;;
esac
