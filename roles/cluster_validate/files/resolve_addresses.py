#!/usr/bin/env python3
"""Resolve cluster addresses on the controller for cluster_validate.

Usage: resolve_addresses.py [--network CIDR] HOST=ADDRESS ...
Prints one JSON object: {"network_error": str|null, "hosts": {HOST: {"address", "ip", "in_network"}}}.
The role asserts on it, so that every message names the host and the setting to fix.
"""

import argparse
import ipaddress
import json
import socket


def resolve(address: str) -> str | None:
    """First IPv4 address of a name or literal (DGL's ip_config holds IPv4 addresses), None if none."""
    try:
        infos = socket.getaddrinfo(address, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    return infos[0][4][0] if infos else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="", help="CIDR every address must lie in")
    parser.add_argument("hosts", nargs="*", metavar="HOST=ADDRESS")
    args = parser.parse_args()

    network, network_error = None, None
    if args.network:
        try:
            network = ipaddress.ip_network(args.network, strict=False)
        except ValueError as error:
            network_error = str(error)

    hosts = {}
    for pair in args.hosts:
        host, _, address = pair.partition("=")
        ip = resolve(address)
        in_network = None if network is None or ip is None else ipaddress.ip_address(ip) in network
        hosts[host] = {"address": address, "ip": ip, "in_network": in_network}
    print(json.dumps({"network_error": network_error, "hosts": hosts}))


if __name__ == "__main__":
    main()
