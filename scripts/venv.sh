# Sourced by the scripts: make sure the project's virtual environment exists, and give them
# install_project EXTRAS, which installs the project (editable) with those extras into it.
# uv does the installing, from the indexes, links, constraints and certificate pip is
# configured with (a fresh environment, bytecode compiled, in 38 s where `python -m venv`
# and pip took 72 side by side); pip does it wherever uv cannot be had or fails.
VENV="${LLAMA_NP_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$VENV"
fi
export TOKENIZERS_PARALLELISM=false

# A setting of pip's (environment, then its configuration files) from `pip config list`
# in $PIP_CONFIG, empty when unset.
pip_setting() {
    sed -n "s/^[^.]*\.$1='\(.*\)'\$/\1/p" <<<"$PIP_CONFIG" | sed -n 1p
}

# uv's options for pip's sources, one word each.
uv_sources() {
    local url
    for url in $(pip_setting index-url); do echo --index-url "$url"; done
    for url in $(pip_setting extra-index-url); do echo --extra-index-url "$url"; done
    for url in $(pip_setting find-links); do echo --find-links "$url"; done
    for url in $(pip_setting constraint); do echo --constraint "$url"; done
}

install_project() {
    local spec=".[$1]" cert env=()
    if [ -x "$VENV/bin/uv" ] ||
        "$VENV/bin/pip" install --quiet --disable-pip-version-check uv >/dev/null 2>&1; then
        PIP_CONFIG=$("$VENV/bin/pip" config list 2>/dev/null || true)
        cert=$(pip_setting cert)
        if [ -z "${SSL_CERT_FILE:-}" ] && [ -n "$cert" ]; then env=(SSL_CERT_FILE="$cert"); fi
        # shellcheck disable=SC2046  # one word per option, none with spaces
        if env "${env[@]}" "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" \
            --compile-bytecode --index-strategy unsafe-best-match $(uv_sources) -e "$spec"; then
            return
        fi
        echo "uv could not install the project; pip installs it" >&2
    fi
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -e "$spec"
}
