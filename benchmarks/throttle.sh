#!/usr/bin/env bash
# Make a cgroup (v2) whose writes to the disk holding DIR are held to MBPS MB/s (io.max wbps), for steady_bench.py
# --cgroup. Prints the cgroup's path on success; on failure says why and exits 1.
#   bash benchmarks/throttle.sh DIR MBPS [NAME]
set -u
dir=$1 mbps=$2 name=${3:-lnv-throttle}
mkdir -p "$dir"
root=/sys/fs/cgroup
[ -f "$root/cgroup.controllers" ] || { echo "no cgroup v2 at $root" >&2; exit 1; }
src=$(findmnt -no SOURCE --target "$dir")
fstype=$(findmnt -no FSTYPE --target "$dir")
if [ "$fstype" = overlay ]; then  # the upper directory's file system holds the writes
  upper=$(findmnt -no OPTIONS --target "$dir" | tr , '\n' | sed -n 's/^upperdir=//p')
  src=$(findmnt -no SOURCE --target "$upper")
fi
dev=$(lsblk -ndo MAJ:MIN "$src" 2>/dev/null | tr -d ' ')
if [ -z "$dev" ]; then  # a partition: throttle its disk
  echo "no block device for $dir (source $src, $fstype)" >&2; exit 1
fi
parent=$(lsblk -ndo PKNAME "$src" 2>/dev/null)
[ -n "$parent" ] && dev=$(lsblk -ndo MAJ:MIN "/dev/$parent" | tr -d ' ')
grep -qw io "$root/cgroup.controllers" || { echo "the io controller is not available: $(cat $root/cgroup.controllers)" >&2; exit 1; }
echo +io > "$root/cgroup.subtree_control" 2>/dev/null || true
mkdir -p "$root/$name" || exit 1
echo "$dev wbps=$((mbps * 1000000))" > "$root/$name/io.max" || { echo "cannot set io.max on $dev" >&2; exit 1; }
echo "$root/$name"
echo "throttled $dev ($src, $fstype) to $mbps MB/s: $(cat $root/$name/io.max)" >&2
