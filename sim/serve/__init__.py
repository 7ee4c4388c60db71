"""``sim serve``: a page that shows a world live and steers it, and the JSON API it uses.

``app`` is the aiohttp application (its routes), ``boundary`` its trust boundary (the
token, the ``Host`` and ``Origin`` checks, the body limit, the security headers), ``hub``
the page's event streams' listeners, ``views`` what the API answers (read from the world
and its tick logs), ``loading`` the world it answers from (loaded and validated in the
background once the address is printed, kept until its files change), ``preview`` a big
world's first look while it loads (only the aggregated views' fields, checked minimally),
``driver`` the runs started from the page (the library's ``Runner`` on a thread of its
own), ``runs`` a study's or a sweep's folder served (its runs and their progress). The
page's files are in ``static/``, shipped with the package. docs/serve.md documents the
API.

Owns: the HTTP server of one world or one study's or sweep's folder (its token, Host and
Origin checks, body limits), the API's answers, the runs started from the page and the
page itself.

May import: ``sim.analysis`` (the report's gathering of a tick), ``sim.config``,
``sim.engine`` (the ``Runner``), ``sim.errors``, ``sim.gcpause``, ``sim.interrupts``,
``sim.interventions`` and ``sim.interview`` (what ``sim inject``, ``sim set`` and
``sim ask`` call), ``sim.llm``, ``sim.pack`` (a packed world's first look),
``sim.phases``, ``sim.runs`` (a run's record and tick),
``sim.safefs``, ``sim.sections`` (a call's input read back), ``sim.storage``,
``sim.ticklog``, ``sim.world``.

Next: a new API route goes in ``app`` with its answer in ``views`` (a change through the
library function its command calls, in ``driver`` when it runs ticks), documented in
docs/serve.md; a new check every request passes goes in ``boundary``.
"""
