"""``sao-gym view``: learning curves, episode lists and token strips of runs, in the browser.

:func:`~sao_gym.viewer.server.make_app` builds the aiohttp app over run
directories; :func:`~sao_gym.viewer.server.serve` runs it. The front end is
static files (``static/``, no build step) with a vendored charting library
(uPlot, MIT). See docs/metrics.md.
"""
