"""Package discovery for airflow-provider-trainops: each top-level folder below installs as the
``trainops`` subpackage it names, with every package beneath it found automatically."""

from setuptools import find_packages, setup

FOLDERS = {
    "trainops.hooks": "hooks",
    "trainops.operators": "operators",
    "trainops.sensors": "sensors",
    "trainops.triggers": "triggers",
    "trainops.provider": "provider",
    "trainops.plugins": "plugins",
}

setup(
    package_dir=FOLDERS,
    packages=[
        f"{name}.{sub}" if sub else name
        for name, folder in FOLDERS.items()
        for sub in ["", *find_packages(where=folder)]
    ],
    package_data={"trainops.plugins": ["static/*"]},  # the UI views' modules and icon, shipped (no CDN)
)
