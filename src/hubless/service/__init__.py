"""``hubless serve``: an HTTP API over saved indexes (needs ``pip install 'hubless[serve]'``).

    app = hubless.service.create_app({"coco": "idx/"}, model="openai/clip-vit-base-patch32")
    uvicorn.run(app, host="127.0.0.1", port=8000)

See :mod:`hubless.service.app` for the endpoints and the layout of this package.
"""

from hubless.service.app import create_app
from hubless.service.schemas import SearchRequest
from hubless.service.settings import Limits

__all__ = ["Limits", "SearchRequest", "create_app"]
