"""Renderers: pictures and figures from arrays, files and rows, with no database.

* :mod:`backend.render.image`: the image viewer's renderer of L2 products (memory-mapped
  pyramid, region and DQ PNGs, WCS description, pixel readout, an event placed on a frame).
* :mod:`backend.render.figures`: the Plotly event timeline and light curve, HEK type names
  and colours.
* :mod:`backend.render.figures_density`: the landing timeline's density figure.
* :mod:`backend.render.event_figures`: an event page's light curves (Plotly).

What to draw is chosen by the services (:mod:`backend.services.imaging`: the events of a
frame, the context images of an event; :mod:`backend.services.event_histogram`,
:mod:`backend.services.event_curves`), which import these modules, never the other way:
nothing here imports ``backend.db``, ``backend.models``, ``backend.services`` or SQLAlchemy
(``tests/test_architecture.py``).
"""
