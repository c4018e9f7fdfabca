import asyncio

from aml_publisher.main import create_app

asyncio.run(create_app().run())
