"""FastAPI dependencies (``Annotated`` style, as the FastAPI full-stack template)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends
from sqlalchemy.orm import Session

from backend.db import get_sessionmaker
from backend.settings import Settings, get_settings


def get_session() -> Iterator[Session]:
    """One session per request on the API's engine (short timeouts, :func:`backend.db.db_timeouts`);
    committed by the handler that writes, closed after."""
    session = get_sessionmaker("api")()
    try:
        yield session
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
