import asyncio

from aml_scheduler.main import create_app

asyncio.run(create_app().run())
