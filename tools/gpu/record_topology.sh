#!/usr/bin/env bash
# Record the parts of this machine's sysfs/procfs that @nerva/transport reads, as a tree of small
# text files that mirrors their paths, plus symlinks.txt (one "path -> target" line per symbolic
# link, as readlink prints it), so the tree can become a test fixture
# (packages/transport/test/fixtures/<name>/, read with createSysfsReader(<tree>)).
#
#   bash tools/gpu/record_topology.sh [DEST]        DEST defaults to $OUT/topology (./topology without OUT)
#
# Recorded: PCI functions of class display/3D (0x03xxxx), network (0x02xxxx) and NVIDIA bridges
# (NVSwitch, 0x0680xx), every bridge on their paths to the root complex, IOMMU groups (type, device
# links) and units, NUMA node cpulists and distances, /sys/module entries of the NVIDIA, peer-memory
# and RDMA modules, /proc/driver/nvidia, IOMMU arguments of /proc/cmdline, CXL memory devices, and
# nvidia-smi's topology views where nvidia-smi exists. GPU UUIDs are replaced by zeros; nothing else
# from /proc/cmdline is kept.
#
# The device tool brings back files at most two folders below $OUT, so the tree is also packed as
# DEST.tar.gz (with DEST/nvidia-smi-topo.txt beside it); unpack that here.
set -uo pipefail

dest=${1:-${OUT:-.}/topology}
dest=${dest%/}
rm -rf "$dest" "$dest.tar.gz"
mkdir -p "$dest"
manifest="$dest/symlinks.txt.tmp"
: > "$manifest"

bdf_re='^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$'

# copy_file PATH: the file's text (at most 64 KiB) at the same path under $dest.
copy_file() {
  local p=$1
  [ -f "$p" ] && [ -r "$p" ] || return 0
  mkdir -p "$dest$(dirname "$p")"
  head -c 65536 "$p" > "$dest$p" 2>/dev/null || rm -f "$dest$p"
}

# record_link PATH: one manifest line when PATH is a symbolic link.
record_link() {
  local p=$1
  [ -L "$p" ] || return 0
  printf '%s -> %s\n' "${p#/}" "$(readlink "$p")" >> "$manifest"
}

# mark_dir PATH: make sure a directory survives git (which keeps no empty folders).
mark_dir() {
  mkdir -p "$dest$1"
  [ -n "$(ls -A "$dest$1" 2>/dev/null)" ] || : > "$dest$1/.recorded"
}

declare -A wanted=()
n_gpu=0 n_nic=0
for link in /sys/bus/pci/devices/*; do
  [ -e "$link" ] || continue
  bdf=$(basename "$link")
  class=$(cat "$link/class" 2>/dev/null || echo 0x000000)
  vendor=$(cat "$link/vendor" 2>/dev/null || echo 0x0000)
  keep=0
  case "$class" in
    0x03*) keep=1; n_gpu=$((n_gpu + 1)) ;;
    0x02*) keep=1; n_nic=$((n_nic + 1)) ;;
    0x0680*) [ "$vendor" = 0x10de ] && keep=1 ;;
  esac
  [ "$keep" = 1 ] || continue
  wanted[$bdf]=1
  # every bridge between the root complex and the device
  real=$(readlink -f "$link")
  IFS=/ read -ra parts <<< "$real"
  for part in "${parts[@]}"; do
    [[ "$part" =~ $bdf_re ]] && wanted[$part]=1
  done
done

for bdf in "${!wanted[@]}"; do
  link=/sys/bus/pci/devices/$bdf
  [ -e "$link" ] || continue
  record_link "$link"
  dir=$(readlink -f "$link")
  for f in class vendor device subsystem_vendor subsystem_device revision numa_node local_cpulist \
           current_link_speed current_link_width max_link_speed max_link_width; do
    copy_file "$dir/$f"
  done
  record_link "$dir/driver"
  record_link "$dir/iommu_group"
  for ifdir in "$dir"/net/* "$dir"/virtio*/net/*; do
    [ -d "$ifdir" ] || continue
    copy_file "$ifdir/operstate"
    mark_dir "$ifdir"
  done
  for ib in "$dir"/infiniband/*; do
    [ -d "$ib" ] || continue
    copy_file "$ib/node_type"
    mark_dir "$ib"
  done
done

# IOMMU: groups (type, member links) and hardware units.
for g in /sys/kernel/iommu_groups/*; do
  [ -d "$g" ] || continue
  copy_file "$g/type"
  for d in "$g"/devices/*; do record_link "$d"; done
  mark_dir "$g"
done
for u in /sys/class/iommu/*; do
  record_link "$u"
  [ -d "$u" ] && mark_dir "$(readlink -f "$u")"
done

# NUMA nodes.
copy_file /sys/devices/system/node/online
copy_file /sys/devices/system/node/possible
for n in /sys/devices/system/node/node[0-9]*; do
  [ -d "$n" ] || continue
  copy_file "$n/cpulist"
  copy_file "$n/distance"
done

# Kernel modules that matter for transfers.
for m in /sys/module/*; do
  name=$(basename "$m")
  case "$name" in
    nvidia* | nv_peer_mem | *peermem* | *peer_mem* | ib_core | ib_uverbs | mlx5_core | mlx5_ib | amdgpu)
      copy_file "$m/initstate"
      copy_file "$m/version"
      mark_dir "$m"
      ;;
  esac
done

# CXL memory devices.
for c in /sys/bus/cxl/devices/mem*; do
  record_link "$c"
  [ -e "$c" ] && mark_dir "$(readlink -f "$c")"
done

# NVIDIA driver view (UUIDs zeroed) and the IOMMU arguments of the kernel command line.
for info in /proc/driver/nvidia/gpus/*/information; do
  [ -f "$info" ] || continue
  mkdir -p "$dest$(dirname "$info")"
  sed -E 's/GPU-[0-9a-fA-F-]+/GPU-00000000-0000-0000-0000-000000000000/' "$info" > "$dest$info"
done
copy_file /proc/driver/nvidia/version
if [ -r /proc/cmdline ]; then
  mkdir -p "$dest/proc"
  tr ' ' '\n' < /proc/cmdline | grep -i iommu | tr '\n' ' ' | sed 's/ $//' > "$dest/proc/cmdline"
  echo >> "$dest/proc/cmdline"
fi

{
  echo "# recorded by tools/gpu/record_topology.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ), kernel $(uname -r)"
  echo '# path -> target, as readlink prints it (see packages/transport/src/sysfs.ts)'
  sort -u "$manifest"
} > "$dest/symlinks.txt"
rm -f "$manifest"

if command -v nvidia-smi > /dev/null 2>&1; then
  {
    echo '$ nvidia-smi topo -m'; nvidia-smi topo -m 2>&1
    echo; echo '$ nvidia-smi topo -p2p r'; nvidia-smi topo -p2p r 2>&1
    echo; echo '$ nvidia-smi --query-gpu=index,pci.bus_id,name,driver_version --format=csv'
    nvidia-smi --query-gpu=index,pci.bus_id,name,driver_version --format=csv 2>&1
    echo; echo '$ nvidia-smi nvlink --status'; nvidia-smi nvlink --status 2>&1
  } > "$dest/nvidia-smi-topo.txt"
else
  echo 'nvidia-smi not found' > "$dest/nvidia-smi-topo.txt"
fi

tar -czf "$dest.tar.gz" -C "$(dirname "$dest")" "$(basename "$dest")"
files=$(find "$dest" -type f | wc -l)
links=$(grep -vc '^#' "$dest/symlinks.txt")
echo "[record_topology] $n_gpu display and $n_nic network functions, ${#wanted[@]} PCI functions with bridges; $files files, $links links -> $dest (and $dest.tar.gz)"
