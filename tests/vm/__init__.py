"""A package so that the VM lab is a package-scoped fixture: its emulated VMs stop as soon as the tier's last
test ends instead of idling under TCG, still burning CPU, until the whole pytest worker ends."""
