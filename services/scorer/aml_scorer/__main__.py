import asyncio

from aml_scorer.main import create_app

asyncio.run(create_app().run())
