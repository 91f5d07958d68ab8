# herald %preun: on erase ($1 = 0, not an upgrade), stop running units before the binary goes.
if [ "$1" = 0 ] && [ -d /run/systemd/system ]; then
    systemctl stop herald-up.service herald-memo.service 'herald@*.service' >/dev/null 2>&1 || :
fi
