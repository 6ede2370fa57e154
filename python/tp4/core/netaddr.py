"""Addresses and host names as the programs that consume them read them, and the one way tp4 writes
a host into a URL or a host:port (an IPv6 address in brackets, RFC 3986 section 3.2.2).

An address is parsed with :mod:`ipaddress` (dotted IPv4 of four decimal parts, or IPv6 without a
zone index, which cannot go into a URL unescaped); a host name by the RFC 1123 label rules (labels
of 1-63 letters, digits and '-', not starting or ending with '-', 253 characters in all), and a
name whose last label is all digits is refused, because resolvers and URL parsers read it as an
IPv4 address ("999.999.999.999", "0")."""

from __future__ import annotations

import ipaddress
import re

_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", re.ASCII)
MAX_NAME = 253

IP_WORDS = "an IPv4 address (10.0.0.1) or an IPv6 address (fd00::1)"
HOST_WORDS = "an IP address (10.0.0.1, fd00::1) or a host name (spark1, spark1.lan: letters, digits and '-' per label)"


def ip_problem(value: str) -> str | None:
    """None if value is an IP address a node can be reached at, else what is wrong with it."""
    if "%" in value:
        return "has an IPv6 zone index (%...), which no URL or dist-init address can carry"
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return f"is not {IP_WORDS}"
    if address.is_unspecified or address.is_multicast or (address.version == 4 and value == "255.255.255.255"):
        return "is an unspecified, multicast or broadcast address, not one a node has"
    return None


def name_problem(value: str) -> str | None:
    """None if value is an RFC 1123 host name (not all-numeric in its last label), else why not."""
    name = value[:-1] if value.endswith(".") else value
    if not name or len(name) > MAX_NAME:
        return f"is not a host name (1-{MAX_NAME} characters)"
    labels = name.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return "is not a host name: each dot-separated label is 1-63 letters, digits or '-', not starting or ending with '-'"
    if labels[-1].isdigit():
        return "reads as an IPv4 address but is not one (a host name's last label is never all digits)"
    return None


def host_problem(value: str) -> str | None:
    """None if value is an IP address or a host name, else why not."""
    if ":" in value or (value.replace(".", "").isdigit()):
        return ip_problem(value)
    return name_problem(value)


def bind_problem(value: str) -> str | None:
    """None if a server can bind value: an IP address (0.0.0.0 or :: for every address) or a host
    name; else why not."""
    if ":" in value or value.replace(".", "").isdigit():
        if value.startswith("[") and value.endswith("]"):
            return "is an IPv6 address in brackets (brackets belong in URLs, not in an address)"
        problem = ip_problem(value)
        if problem and "unspecified" in problem and "%" not in value and ipaddress.ip_address(value).is_unspecified:
            return None
        return problem
    return name_problem(value)


def is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def url_host(host: str) -> str:
    """host as it goes into a URL or a host:port: an IPv6 address in brackets, anything else as is."""
    return f"[{host}]" if is_ipv6(host) else host


def host_port(host: str, port: int) -> str:
    return f"{url_host(host)}:{port}"


def split_host_port(text: str) -> tuple[str, str] | None:
    """ "host:port" or "[v6]:port" to (host, port text); None when it has no port part."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            return None
        return host, rest[1:]
    host, sep, port = text.rpartition(":")
    if not sep or ":" in host:
        return None
    return host, port
