import asyncio

from aml_searcher.main import create_app

asyncio.run(create_app().run())
