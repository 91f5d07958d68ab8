# herald %post: the herald system user, then tell systemd about the units (none is enabled).
# $1 is 1 on install, 2 on upgrade.
if command -v systemd-sysusers >/dev/null 2>&1; then
    systemd-sysusers /usr/lib/sysusers.d/herald.conf
elif ! getent passwd herald >/dev/null; then
    useradd --system --user-group --home-dir /var/lib/herald --no-create-home \
        --shell /sbin/nologin --comment "herald MCP watch pipeline" herald
fi
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null 2>&1 || :
fi
