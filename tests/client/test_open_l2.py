"""``lstdp_client.open_l2``: an L2 product as ONE sunpy map with its uncertainty and mask
(issue 25.7), and the README's documented call gives exactly that.

Products are written by the platform's own writer from a small synthetic frame (no server).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from astropy.io import fits

from pipelines.calibration.l2.flow import calibrate_frame
from pipelines.fitsio import write_fits_atomic
from pipelines.products import build_product_hdul, dq_table_hdu
from tests.conftest import ROOT
from tests.test_calibration_steps import _synthetic_wst


@pytest.fixture(scope="module")
def product(tmp_path_factory):
    raw, h, cals, _ = _synthetic_wst(48, roll=3.0)
    res = calibrate_frame(raw, h, cals)
    assert res.uncertainty is not None and (res.dq != 0).any()
    path = tmp_path_factory.mktemp("open_l2") / "lst_wst_l2.fits"
    write_fits_atomic(build_product_hdul(res, software_version="test"), path)
    return path, res


def test_open_l2_gives_one_map_with_uncertainty_and_mask(product):
    import sunpy.map
    from astropy.nddata import StdDevUncertainty

    from lstdp_client import open_l2

    path, res = product
    m = open_l2(path)
    assert isinstance(m, sunpy.map.GenericMap)  # one map, not a list
    np.testing.assert_array_equal(m.data, res.data)
    assert isinstance(m.uncertainty, StdDevUncertainty)
    np.testing.assert_array_equal(m.uncertainty.array, res.uncertainty)
    np.testing.assert_array_equal(m.mask, (res.dq != 0) | ~np.isfinite(res.data))
    assert m.unit is not None and m.uncertainty.unit in (None, m.unit)
    assert m.detector == "WST"
    # the documented alternative for the data alone is one map too; bare Map() is sunpy's one-per-HDU
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert isinstance(sunpy.map.Map(path, hdus=0), sunpy.map.GenericMap)


def test_open_l2_reads_the_older_layout_without_uncert(product, tmp_path):
    from lstdp_client import open_l2

    path, res = product
    with fits.open(path) as h:
        old = fits.HDUList([fits.PrimaryHDU(h[0].data, h[0].header), dq_table_hdu(h["DQ"].data)])
    older = tmp_path / "older.fits"
    old.writeto(older, checksum=True)
    m = open_l2(older)
    assert m.uncertainty is None
    np.testing.assert_array_equal(m.mask, (res.dq != 0) | ~np.isfinite(res.data))
    with pytest.raises(ValueError, match="no 2-D data image"):
        fits.HDUList([fits.PrimaryHDU()]).writeto(tmp_path / "empty.fits")
        open_l2(tmp_path / "empty.fits")


def test_the_readmes_documented_call_opens_each_product_as_one_map(product):
    """The README's Fido example opens the fetched files with one documented statement; run it."""
    import sunpy.map

    path, _ = product
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?Fido\.fetch.*?)```", readme, re.S).group(1)
    lines = block.splitlines()
    opening = [ln for ln in lines if ln.startswith("maps = ")]
    imports = [ln for ln in lines if ln.startswith(("from lstdp_client import", "import sunpy.map"))]
    assert len(opening) == 1, block
    scope = {"files": [str(path), str(path)]}
    exec("\n".join(imports + opening), scope)  # noqa: S102 - the README's own lines
    maps = scope["maps"]
    assert len(maps) == 2 and all(isinstance(m, sunpy.map.GenericMap) for m in maps)
    assert all(m.uncertainty is not None and m.mask is not None for m in maps)
