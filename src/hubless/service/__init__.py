"""``hubless serve``: an HTTP API over saved indexes (needs ``pip install 'hubless[serve]'``).

    app = hubless.service.create_app({"coco": "idx/"}, settings=hubless.service.Settings(image_root="images/"))
    uvicorn.run(app, host="127.0.0.1", port=8000)

See :mod:`hubless.service.app` for the endpoints and the layout of this package, and
``docs/service.md`` for the reference.
"""

from hubless.service.app import create_app
from hubless.service.schemas import SearchRequest
from hubless.service.settings import Keys, Limits, ServeSettings, Settings

__all__ = ["Keys", "Limits", "SearchRequest", "ServeSettings", "Settings", "create_app"]
