"""The torch process-group backend of a job: Ray Train's, plus the network interface each rank talks on.

Gloo picks its interface by resolving the host name. On many clusters (network
namespaces, containers, cloud images with ``127.0.1.1 hostname`` in
``/etc/hosts``) that resolves to a loopback address, so ranks on different
nodes advertise 127.0.0.1 to each other and their first collective waits
forever. Hand-wired TorchRec jobs fix it by exporting ``GLOO_SOCKET_IFNAME``
on every node by hand; :class:`RayembTorchConfig` does it per worker, before
the process group starts: each rank uses the interface holding the address
Ray itself reaches its node on (``ray.util.get_node_ip_address()``), so nodes
need not even share interface names. A value the user set is left alone, and
a single-node cluster on 127.0.0.1 needs nothing.

Example::

    >>> TorchTrainer(loop, torch_config=RayembTorchConfig(backend="gloo"), ...)
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import struct
from typing import Dict, Optional

from ray.train.torch.config import TorchConfig, _TorchBackend

logger = logging.getLogger(__name__)

#: the variables naming the interface of each backend's sockets (NCCL's bootstrap uses its own)
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915


def interface_addresses() -> Dict[str, str]:
    """IPv4 address of every interface that has one (Linux ``SIOCGIFADDR``), name -> address."""
    out: Dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address on this interface
                continue
            out[name] = socket.inet_ntoa(packed[20:24])
    return out


def interface_for(address: str, addresses: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The interface holding ``address``; None for a loopback address or when no interface has it."""
    try:
        if ipaddress.ip_address(address).is_loopback:
            return None
    except ValueError:
        return None
    for name, addr in (interface_addresses() if addresses is None else addresses).items():
        if addr == address:
            return name
    return None


def pin_socket_interface(node_ip: Optional[str] = None) -> Optional[str]:
    """Sets ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` to the interface of this node's Ray address.

    Runs in a Ray Train worker before the process group starts; returns the
    interface set (None when nothing was set: user-set, loopback, not found).
    """
    if any(os.environ.get(v) for v in SOCKET_IFNAME_VARS):
        return None
    if node_ip is None:
        import ray.util

        node_ip = ray.util.get_node_ip_address()
    name = interface_for(node_ip)
    if name is None:
        return None
    for var in SOCKET_IFNAME_VARS:
        os.environ[var] = name
    logger.info("collectives use interface %s (%s), the one Ray reaches this node on", name, node_ip)
    return name


class _RayembTorchBackend(_TorchBackend):
    def on_start(self, worker_group, backend_config):  # noqa: D102 - Ray's Backend hook
        worker_group.execute(pin_socket_interface)
        super().on_start(worker_group, backend_config)


class RayembTorchConfig(TorchConfig):
    """Ray Train's ``TorchConfig`` whose workers talk on their node's Ray interface (module docstring)."""

    @property
    def backend_cls(self):
        return _RayembTorchBackend


__all__ = ["RayembTorchConfig", "pin_socket_interface", "interface_for", "interface_addresses"]
