import asyncio

from aml_answerer.main import create_app

asyncio.run(create_app().run())
