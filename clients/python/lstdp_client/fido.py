"""The sunpy Fido client of the LST data platform: importing this module adds it to ``Fido``.

>>> import lstdp_client.fido                                         # doctest: +SKIP
>>> from sunpy.net import Fido, attrs as a                           # doctest: +SKIP
>>> res = Fido.search(a.Time("2004-03-01", "2004-03-02"), a.Instrument("LST"), a.Detector("SDI"))  # doctest: +SKIP
>>> files = Fido.fetch(res, path="downloads")                        # doctest: +SKIP

The client is a :class:`sunpy.net.base_client.BaseClient` subclass (sunpy's "writing a new
Fido client" guide): defining it registers it with Fido (``BaseClient.__init_subclass__``),
its attrs module as ``a.lst`` (:mod:`lstdp_client.attrs`) and its values (``a.Instrument.lst``,
``a.Detector.sdi``...) through :meth:`LSTClient.register_values`. It answers queries with
``a.Instrument("LST")`` (or one of its own attrs) and only sunpy core attrs it knows:
``a.Time`` (DATE-OBS range, UTC, inclusive), ``a.Detector`` (SDI, WST, SCI-UV, SCI-WL),
``a.Level(2)``, ``a.Provider("LSTDP")``, ``a.Source("ASO-S")``, and ``a.lst.Channel``,
``a.lst.CalibrationSet``, ``a.lst.ProductVersion``. Only written L2 products (those with a
FITS file) are listed.

The server is ``LSTClient(url=...)``, else the ``LSTDP_URL`` environment variable, else
``http://127.0.0.1:8000`` (Fido makes its clients without arguments); a token from
``LSTDP_TOKEN`` is sent with the searches when set. Fido's own downloader sends no token:
to fetch products of a private calibration set, pass one that does,
``Fido.fetch(res, downloader=lstdp_client.Client(token=...).downloader())``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from sunpy.net import attrs as a
from sunpy.net.attr import AttrAnd, AttrOr, AttrWalker, DataAttr, and_
from sunpy.net.base_client import BaseClient, QueryResponseTable, convert_row_to_table

from lstdp_client import attrs as la
from lstdp_client.client import URL_ENV, Client

__all__ = ["LSTClient", "offline_fido", "INSTRUMENT", "SOURCE", "PROVIDER", "CHANNELS"]

INSTRUMENT = "LST"
SOURCE = "ASO-S"
PROVIDER = "LSTDP"
#: LST channels and what they are (``pipelines/channels.py`` of the platform).
CHANNELS: dict[str, str] = {
    "SDI": "Lyman-alpha solar disk imager (121.6 nm)",
    "WST": "White-light solar telescope (360 nm)",
    "SCI-UV": "Lyman-alpha solar corona imager (121.6 nm)",
    "SCI-WL": "White-light solar corona imager (700 nm)",
}
#: Other spellings the platform accepts (``pipelines.channels.get_channel``).
_ALIASES = {"SCIUV": "SCI-UV", "SCI-LYA": "SCI-UV", "SCIWL": "SCI-WL"}


def _channel(value: Any) -> str | None:
    """The channel code of a Detector/Channel value, None if it is not an LST channel."""
    key = str(value).strip().upper().replace("_", "-")
    key = _ALIASES.get(key, key)
    return key if key in CHANNELS else None


def _level(value: Any) -> int | None:
    """2 for ``2``, ``"2"``, ``"L2"``, ``"l2"``; the number for other levels; None if unreadable."""
    text = str(value).strip().upper().removeprefix("L")
    try:
        return int(float(text))
    except ValueError:
        return None


# -- the query walker: an AND of attrs -> one dict of API parameters and checks ----------------

walker = AttrWalker()


@walker.add_creator(AttrOr)
def _create_or(wlk, tree):
    out = []
    for sub in tree.attrs:
        out += wlk.create(sub)
    return out


@walker.add_creator(AttrAnd, DataAttr)
def _create_and(wlk, tree):
    params: dict[str, Any] = {}
    wlk.apply(tree, params)
    return [params]


@walker.add_applier(AttrAnd)
def _apply_and(wlk, and_attr, params):
    for sub in and_attr.attrs:
        wlk.apply(sub, params)


def _set(params: dict[str, Any], key: str, value: Any) -> None:
    """``params[key] = value``; a second, different value for the same key makes the query
    match nothing (an AND of two channels, two sets...)."""
    if key in params and params[key] != value:
        params["_empty"] = True
    params[key] = value


@walker.add_applier(a.Time)
def _apply_time(wlk, attr, params):
    # a.Time has no open ends; an AND of two ranges is their overlap
    start, end = attr.start.utc.isot + "Z", attr.end.utc.isot + "Z"
    params["start"] = max(params.get("start", start), start)
    params["end"] = min(params.get("end", end), end)
    if params["end"] < params["start"]:
        params["_empty"] = True


@walker.add_applier(a.Instrument, a.Source, a.Provider, a.Level)
def _apply_checked(wlk, attr, params):
    # _can_handle_query let only our values through; nothing to send
    pass


@walker.add_applier(a.Detector, la.Channel)
def _apply_channel(wlk, attr, params):
    _set(params, "channel", _channel(attr.value))


@walker.add_applier(la.CalibrationSet)
def _apply_set(wlk, attr, params):
    _set(params, "calibration_set", int(attr.value))


@walker.add_applier(la.ProductVersion)
def _apply_version(wlk, attr, params):
    # a product's version is its calibration set's id (ProductPublic.version)
    _set(params, "calibration_set", int(attr.value))
    _set(params, "_version", int(attr.value))


class LSTClient(BaseClient):
    """LST (ASO-S Lyman-alpha Solar Telescope) L2 products of an LST data platform server.

    Parameters
    ----------
    url : str, optional
        The server; default ``LSTDP_URL`` or ``http://127.0.0.1:8000``.
    token : str, optional
        API token (``lst_...``); default ``LSTDP_TOKEN``. Needed only for products of a
        private calibration set.

    Examples
    --------
    >>> from sunpy.net import Fido, attrs as a                       # doctest: +SKIP
    >>> import lstdp_client.fido                                     # doctest: +SKIP
    >>> Fido.search(a.Time("2004-03-01", "2004-03-02"), a.Instrument("LST"), a.Level(2))  # doctest: +SKIP
    """

    _SUPPORTED = frozenset({a.Time, a.Instrument, a.Detector, a.Level, a.Provider, a.Source,
                            la.Channel, la.CalibrationSet, la.ProductVersion})
    _OWN = frozenset({la.Channel, la.CalibrationSet, la.ProductVersion})

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        self.url = url or os.environ.get(URL_ENV)
        self.token = token

    def _client(self) -> Client:
        return Client(self.url, token=self.token)

    @property
    def info_url(self) -> str:
        """The server's API documentation (``/docs``)."""
        from lstdp_client.client import DEFAULT_URL

        return (self.url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/") + "/docs"  # no connection made

    def search(self, *query) -> QueryResponseTable:
        """The written L2 products matching ``query`` (one AND of attrs, or ORs of them).

        Returns
        -------
        sunpy.net.base_client.QueryResponseTable
            One row per product version, ordered by DATE-OBS: ``Start Time`` (DATE-OBS, UTC
            Time), ``Instrument`` (LST), ``Detector`` (channel), ``Level``, ``Provider``,
            ``Source``, ``Product ID``, ``Version``, ``Calibration Set``, ``Frame ID`` and
            the hidden ``SHA-256`` and ``URL`` (the FITS download link).

        Raises
        ------
        lstdp_client.errors.LSTDPError
            When the server refuses the query (its ``detail`` in the message) or answers 5xx.
        """
        query = and_(*query)
        rows: list[OrderedDict] = []
        seen: set[int] = set()
        with self._client() as client:
            for params in walker.create(query):
                if params.pop("_empty", False):
                    continue
                version = params.pop("_version", None)
                for p in client.iter_products(state="written", **params):
                    if p["id"] in seen or (version is not None and p.get("version") != version):
                        continue
                    seen.add(p["id"])
                    rows.append(self._row(client, p))
        rows.sort(key=lambda r: (r["Start Time"], r["Version"], r["Product ID"]))
        from astropy.time import Time

        table = QueryResponseTable(rows, client=self) if rows else QueryResponseTable(client=self)
        if rows:
            table["Start Time"] = Time(list(table["Start Time"]), format="isot", scale="utc")
        table.hide_keys = ["SHA-256", "URL", "Frame ID"]
        return table

    @staticmethod
    def _row(client: Client, p: dict[str, Any]) -> OrderedDict:
        date = p["date_obs"]
        iso = date[:-1] if date.endswith("Z") else date.removesuffix("+00:00")
        return OrderedDict([
            ("Start Time", iso),
            ("Instrument", INSTRUMENT),
            ("Detector", p["channel"]),
            ("Level", p.get("level") or "L2"),
            ("Provider", PROVIDER),
            ("Source", SOURCE),
            ("Product ID", int(p["id"])),
            ("Version", int(p["version"])),
            ("Calibration Set", -1 if p.get("calibration_set_id") is None else int(p["calibration_set_id"])),
            ("Frame ID", int(p["frame_id"])),
            ("SHA-256", p.get("sha256") or ""),
            ("URL", client.base_url + p["fits_url"]),
        ])

    @convert_row_to_table
    def fetch(self, query_results, *, path, downloader, **kwargs):
        """Queue the FITS files of ``query_results`` on ``downloader`` (parfive; Fido runs it).

        ``path`` is Fido's pattern, ``<folder>/{file}``, where the row's columns may be used
        too, lower-cased with ``_`` for spaces as sunpy does (``{detector}``, ``{product_id}``);
        ``{file}`` is the server's file name (``Content-Disposition``). Each file is checked against the product's SHA-256, so
        fetching again skips complete files and downloads partial ones again.
        """
        import pathlib

        from parfive.utils import default_name

        for row in query_results:
            fmt = row.response_block_map

            def filename(resp, url, fmt=fmt):  # parfive calls it with (response, url)
                name = default_name(".", resp, url).name
                return pathlib.Path(str(path).format(file=name, **fmt))

            kw = {"checksum": f"sha256={row['SHA-256']}"} if row["SHA-256"] else {}
            downloader.enqueue_file(row["URL"], filename=filename, **kw)

    @classmethod
    def _can_handle_query(cls, *query) -> bool:
        """True for an AND of attrs this client knows, naming LST: ``a.Instrument("LST")`` or
        one of :mod:`lstdp_client.attrs`; any value that is not ours (another instrument,
        detector, level, provider or source) is False."""
        types = {type(x) for x in query}
        if not types or not types <= cls._SUPPORTED:
            return False
        names_us = False
        for x in query:
            if isinstance(x, a.Instrument):
                if str(x.value).strip().upper() != INSTRUMENT:
                    return False
                names_us = True
            elif isinstance(x, a.Detector | la.Channel) and _channel(x.value) is None:
                return False
            elif isinstance(x, a.Level) and _level(x.value) != 2:
                return False
            elif isinstance(x, a.Provider) and str(x.value).strip().upper() != PROVIDER:
                return False
            elif isinstance(x, a.Source) and str(x.value).strip().upper() != SOURCE:
                return False
            elif type(x) in cls._OWN:
                names_us = True
        return names_us

    @classmethod
    def _attrs_module(cls):
        return "lst", "lstdp_client.attrs"

    @classmethod
    def register_values(cls, *query) -> dict:
        """The values Fido lists for this client (``print(Fido)``, ``a.Instrument.lst``...)."""
        return {
            a.Instrument: [(INSTRUMENT, "Lyman-alpha Solar Telescope (ASO-S)")],
            a.Detector: [(code, desc) for code, desc in CHANNELS.items()],
            la.Channel: [(code, desc) for code, desc in CHANNELS.items()],
            a.Level: [("2", "L2: calibrated, in physical units, with a data-quality mask")],
            a.Provider: [(PROVIDER, "LST data platform")],
            a.Source: [(SOURCE, "Advanced Space-based Solar Observatory")],
            a.Time: [("*", "DATE-OBS range of the products (UTC)")],
        }


def offline_fido():
    """A Fido that asks the LST client alone: no VSO, so it works without the internet.

    sunpy's own ``Fido`` also asks the VSO client for any query with ``a.Time``
    (``VSOClient._can_handle_query`` claims them all), which fails where VSO's servers cannot
    be reached (an observatory's private network, a laptop offline, CI). This one is built as
    sunpy builds ``Fido`` (``sunpy.net.fido_factory.UnifiedDownloaderFactory`` with the
    ``_can_handle_query`` validation), with a registry holding :class:`LSTClient` only; its
    ``search`` and ``fetch`` are Fido's own.

    >>> from lstdp_client.fido import offline_fido                   # doctest: +SKIP
    >>> fido = offline_fido()                                         # doctest: +SKIP
    >>> res = fido.search(a.Time("2004-03-01", "2004-03-02"), a.Instrument("LST"), a.Detector("SDI"))  # doctest: +SKIP
    >>> files = fido.fetch(res, path="downloads/{file}")             # doctest: +SKIP

    Returns
    -------
    sunpy.net.fido_factory.UnifiedDownloaderFactory
    """
    from sunpy.net.fido_factory import UnifiedDownloaderFactory

    return UnifiedDownloaderFactory(registry={LSTClient: LSTClient._can_handle_query},
                                    additional_validation_functions=["_can_handle_query"])
