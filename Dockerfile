# responses-ws: the shim as a small, non-root image.
#   docker build -t responses-ws .
#   docker run --rm -p 8787:8787 -e RESPONSES_WS_API_KEYS=sk-local responses-ws
# The wheel is built in a throwaway stage; the runtime stage holds only the installed package.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server_shim ./server_shim
COPY ws_transport ./ws_transport
COPY plugins ./plugins
COPY chat_mapping ./chat_mapping
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[redis]'

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /home/shim --create-home shim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels 'responses-ws[redis]' && rm -rf /wheels
USER 10001
# PYTHONMALLOC=malloc: RSS returns after a burst of clients (README, Load), for ~7% more instructions a turn;
# `serve` would run itself again with it when unset: set here, it starts once
ENV XDG_STATE_HOME=/home/shim/state PYTHONUNBUFFERED=1 PYTHONMALLOC=malloc
EXPOSE 8787
# /healthz is open (no key); python is in the image, curl is not.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8787/healthz', timeout=2)"]
ENTRYPOINT ["responses-ws"]
# Listen on every interface of the container; set RESPONSES_WS_API_KEYS (or _FILE) for clients' keys.
CMD ["serve", "--host", "0.0.0.0", "--port", "8787"]
