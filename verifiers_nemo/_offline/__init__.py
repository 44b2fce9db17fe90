"""Offline clusters: a folder gathered on a connected machine (``prepare --gather DIR``) that a machine without
internet installs from (``VERIFIERS_NEMO_OFFLINE_DIR``, the CLI's ``--offline-dir``), with nothing else reaching the
network."""

from .folder import OFFLINE_DIR_VAR, OfflineFolder, network_off_env, offline_folder

__all__ = ["OFFLINE_DIR_VAR", "OfflineFolder", "network_off_env", "offline_folder"]
