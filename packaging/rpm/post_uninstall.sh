# herald %postun: systemd forgets removed units. The store (/var/lib/herald) and the herald
# user are kept: the store is the administrator's data.
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null 2>&1 || :
fi
