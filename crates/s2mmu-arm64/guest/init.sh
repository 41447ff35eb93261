#!/bin/busybox sh
# /init of the s2mmu Linux guest. Mounts the kernel's filesystems, prints
# how many CPUs are online, runs the program the kernel command line names
# (s2mmu.run=NAME, its arguments in s2mmu.args=A,B,C), then powers off
# (poweroff -f: the kernel's PSCI SYSTEM_OFF).
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp

# /sys/devices/system/cpu/online is a list of ranges: "0-3", "0,2-3".
n=0
IFS=,
for r in $(cat /sys/devices/system/cpu/online); do
  case $r in
    *-*) n=$((n + ${r#*-} - ${r%-*} + 1)) ;;
    *) n=$((n + 1)) ;;
  esac
done
unset IFS
echo "s2mmu-init: cpus online $n"

run=none
args=
for w in $(cat /proc/cmdline); do
  case $w in
    s2mmu.run=*) run=${w#s2mmu.run=} ;;
    s2mmu.args=*) args=$(echo "${w#s2mmu.args=}" | tr , ' ') ;;
  esac
done

case $run in
  none) ;;
  shell)
    echo "s2mmu-init: shell (exit to power off)"
    setsid cttyhack sh
    ;;
  *)
    if [ -x "/bin/$run" ]; then
      # shellcheck disable=SC2086 # the arguments are split on purpose
      "/bin/$run" $args
      echo "s2mmu-init: $run exited $?"
    else
      echo "s2mmu-init: no program $run"
    fi
    ;;
esac
echo "s2mmu-init: power off"
poweroff -f
