#!/bin/busybox sh
# /init of the s2mmu Linux guest. Mounts the kernel's filesystems, prints
# how many CPUs are online, runs the programs the kernel command line names
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

# s2mmu.run=A+B runs A then B; s2mmu.args=X+Y gives A the arguments X and
# B the arguments Y (each a comma-separated list).
run=none
args=
for w in $(cat /proc/cmdline); do
  case $w in
    s2mmu.run=*) run=${w#s2mmu.run=} ;;
    s2mmu.args=*) args=${w#s2mmu.args=} ;;
  esac
done

i=1
for prog in $(echo "$run" | tr + ' '); do
  case $args in
    *+*) a=$(echo "$args" | cut -d+ -f$i) ;;
    *) if [ $i = 1 ]; then a=$args; else a=; fi ;;
  esac
  a=$(echo "$a" | tr , ' ')
  i=$((i + 1))
  case $prog in
    none) ;;
    reboot)
      # PSCI SYSTEM_RESET: the host stops the VM or boots it again.
      echo "s2mmu-init: reboot"
      reboot -f
      ;;
    shell)
      echo "s2mmu-init: shell (exit to power off)"
      setsid cttyhack sh
      ;;
    *)
      if [ -x "/bin/$prog" ]; then
        # shellcheck disable=SC2086 # the arguments are split on purpose
        "/bin/$prog" $a
        echo "s2mmu-init: $prog exited $?"
      else
        echo "s2mmu-init: no program $prog"
      fi
      ;;
  esac
done
echo "s2mmu-init: power off"
poweroff -f
