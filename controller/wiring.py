"""Building drivers and the model book from configuration (the one place that knows
every driver's arguments)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import numpy as np

from controller.config import Config, ConfigError
from controller.model_book import ModelBook
from drivers import driver_class
from drivers.base import Driver, VmType


def make_model_book(
    config: Config, *, driver_name: str, boot_delay_s: float, time_scale: float
) -> ModelBook:
    """The models for this driver; a fresh VM costs the boot delay, in model hours."""
    model_keys = {t.name: t.model_key for t in config.vm_types}
    return ModelBook(
        config.preemption, driver_name, model_keys, launch_h=boot_delay_s * time_scale / 3600.0
    )


def make_driver(
    config: Config,
    *,
    name: str,
    now: Callable[[], float],
    call_at: Callable[[float, Callable[[], None]], Any],
    rng: np.random.Generator,
    boot_delay_s: float,
    time_scale: float,
    book: ModelBook,
    controller_id: str = "",
) -> Driver:
    """The driver `name`; cloud drivers mark their VMs with `controller_id` (the store's
    own id, so that after a restart the daemon finds the VMs it owns)."""
    cls = driver_class(name)
    if name == "aws":
        return cls(config.catalog(), aws_settings(config, controller_id), now=now)
    if name == "gce":
        return cls(
            config.catalog(),
            gce_settings(config, controller_id),
            now=now,
            credentials=_anonymous() if config.gce.anonymous_credentials else None,
        )
    if name in ("local", "sim"):

        def lifetime_h(vm_type: VmType) -> float:
            """One lifetime (model hours) from the configured model for this type and moment."""
            when = dt.datetime.fromtimestamp(now(), dt.UTC)
            return float(book.configured(vm_type, when).model.sample_h(rng, 1)[0])

        return cls(
            config.catalog(),
            now=now,
            call_at=call_at,
            lifetime_h=lifetime_h,
            boot_delay_s=boot_delay_s,
            time_scale=time_scale,
        )
    raise ValueError(f"driver {name!r} cannot be built from this configuration")


def aws_settings(config: Config, controller_id: str) -> Any:
    from drivers.aws import AwsSettings

    aws = config.aws
    if not aws.region:
        raise ConfigError("driver aws needs [aws] region")
    try:
        return AwsSettings(
            region=aws.region,
            controller_id=controller_id,
            endpoint_url=aws.endpoint_url or None,
            image_id=aws.image_id,
            subnet_ids=aws.subnet_ids,
            security_group_ids=aws.security_group_ids,
            iam_instance_profile=aws.iam_instance_profile or None,
            key_name=aws.key_name or None,
            max_spot_price=aws.max_spot_price or None,
            user_data_template=aws.user_data_template or None,
            controller_url=aws.controller_url,
            on_demand_prices=aws.on_demand_prices,
            max_concurrency=aws.max_concurrency,
            max_retries=aws.max_retries,
            price_cache_s=aws.price_cache_s,
        )
    except ValueError as exc:
        raise ConfigError(f"[aws]: {exc}") from None


def gce_settings(config: Config, controller_id: str) -> Any:
    from drivers.gce import GceSettings

    gce = config.gce
    if not gce.project or not gce.zones:
        raise ConfigError("driver gce needs [gce] project and zones (at least one zone)")
    try:
        return GceSettings(
            project=gce.project,
            zones=gce.zones,
            controller_id=controller_id,
            api_endpoint=gce.api_endpoint or None,
            source_image=gce.source_image,
            network=gce.network,
            subnetwork=gce.subnetwork or None,
            service_account_email=gce.service_account_email or None,
            provisioning=gce.provisioning,
            termination_action=gce.termination_action,
            max_concurrency=gce.max_concurrency,
            max_retries=gce.max_retries,
            operation_timeout_s=gce.operation_timeout_s,
            spot_prices={t.name: t.spot_price_per_hour for t in config.vm_types},
            startup_script=gce.startup_script or None,
        )
    except ValueError as exc:
        raise ConfigError(f"[gce]: {exc}") from None


def _anonymous() -> Any:
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()
