#!/usr/bin/env bash
# Gathers the Debian 12 packages the zerod training core needs to BUILD on an air-gapped GPU node
# (one with a compiler, CMake, Ninja and CUDA but none of these libraries), and unpacks them into
# tools/device/deps/ (ignored by git), to be carried to the node with the working tree.
#
# Runs on a connected Debian 12 (bookworm) x86-64 machine, as root or with apt-get usable:
#   tools/device/gather.sh            download what is missing, unpack, relocate, check
#   tools/device/gather.sh --force    unpack again even if deps/ matches the downloaded packages
#
# - .deb files are cached in tools/device/debs/ (ignored; re-runs download nothing new);
# - only headers, CMake/pkg-config files and shared libraries are kept (docs, man pages and
#   static libraries are dropped, except GoogleTest's, which Debian ships static only);
# - the two CMake configs that hard-code /usr (Gloo, OpenBLAS) are rewritten to be relocatable;
# - the result must stay under 64 MiB (the device tool's limit for the whole working tree).
# Then on the node: tools/device/build_and_test.sh (see tools/device/README.md).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
debs="$here/debs"
deps="$here/deps"
limit_mib=60  # leave room for the repository itself inside the 64 MiB that travel
force=0
[[ "${1:-}" == "--force" ]] && force=1

# Development packages (headers, CMake configs, link-time .so) and the runtime libraries they
# and their shared libraries need beyond libc/libstdc++/libgcc (checked below with readelf).
packages=(
  libfmt-dev libfmt9
  libspdlog-dev libspdlog1.10
  nlohmann-json3-dev
  libcli11-dev
  libgtest-dev libgmock-dev
  libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
  libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
  libaio-dev libaio1
)

die() { echo "gather: $*" >&2; exit 1; }

[[ "$(dpkg --print-architecture 2>/dev/null)" == amd64 ]] ||
  die "needs a Debian amd64 machine (the GPU node is x86-64); dpkg says '$(dpkg --print-architecture 2>/dev/null || echo none)'"
command -v apt-get >/dev/null || die "apt-get not found"
command -v readelf >/dev/null || die "readelf not found (apt-get install binutils)"

# ---- download (apt-get download: no install, no root needed for it, works in any folder) ----
mkdir -p "$debs"
need=()
for p in "${packages[@]}"; do
  compgen -G "$debs/${p}_*_*.deb" >/dev/null || need+=("$p")
done
if ((${#need[@]})); then
  echo "gather: downloading ${need[*]}"
  if ! (cd "$debs" && apt-get download -q "${need[@]}" >/tmp/zerod-gather-apt.log 2>&1); then
    echo "gather: apt-get download failed; refreshing the package lists once" >&2
    apt-get update -q >>/tmp/zerod-gather-apt.log 2>&1 || true
    (cd "$debs" && apt-get download -q "${need[@]}" >>/tmp/zerod-gather-apt.log 2>&1) || {
      tail -20 /tmp/zerod-gather-apt.log >&2
      die "apt-get download failed (log: /tmp/zerod-gather-apt.log)"
    }
  fi
else
  echo "gather: all ${#packages[@]} packages already in $debs"
fi

# One .deb per package: if several versions were cached, keep the newest.
files=()
for p in "${packages[@]}"; do
  mapfile -t c < <(ls "$debs/${p}_"*_*.deb | sort -V)
  ((${#c[@]})) || die "no .deb for $p in $debs"
  files+=("${c[-1]}")
done

# ---- unpack into a fresh folder, unless deps/ already holds exactly these packages ----
stamp_new="$(for f in "${files[@]}"; do basename "$f"; done; md5sum <"$0" | cut -d' ' -f1)"
if ((!force)) && [[ -f "$deps/.gathered" ]] && [[ "$(cat "$deps/.gathered")" == "$stamp_new" ]]; then
  echo "gather: $deps already holds these packages (--force to unpack again)"
else
  echo "gather: unpacking ${#files[@]} packages into $deps"
  tmp="$here/.deps.tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  for f in "${files[@]}"; do dpkg -x "$f" "$tmp"; done

  u="$tmp/usr"
  a="$u/lib/x86_64-linux-gnu"
  # Some runtime packages (libnl) still install into /lib: fold it into usr/lib (merged /usr).
  if [[ -d "$tmp/lib" ]]; then
    mkdir -p "$u/lib"
    cp -a "$tmp/lib/." "$u/lib/"
    rm -rf "${tmp:?}/lib"
  fi
  # Not needed to build or run: docs, man pages, lintian overrides, sources, and static libraries
  # (GoogleTest excepted: Debian ships it static only). OpenBLAS's separate BLAS/LAPACK
  # libraries duplicate libopenblas.so, which is what zerod links.
  rm -rf "$u/share/doc" "$u/share/man" "$u/share/lintian" "$u/share/doc-base" "$u/share/bug" \
         "$u/src" "${tmp:?}/etc"
  find "$tmp" -name '*.a' ! -name 'libgtest*.a' ! -name 'libgmock*.a' -delete
  rm -f "$a"/openblas-pthread/libblas.* "$a"/openblas-pthread/liblapack.* \
        "$a"/openblas-pthread/pkgconfig/blas-openblas.pc "$a"/openblas-pthread/pkgconfig/lapack-openblas.pc
  find "$tmp" -xtype l -delete  # links left dangling by the above

  # Gloo: the per-configuration targets file names /usr/lib/libgloo.so.0.5.0; make it relative to
  # the prefix the targets file already computes (_IMPORT_PREFIX = <deps>/usr).
  for f in "$u"/share/cmake/Gloo/GlooTargets-*.cmake; do
    sed -i 's|"/usr/lib/|"${_IMPORT_PREFIX}/lib/|g' "$f"
  done

  # OpenBLAS: Debian's config (reached through an alternatives link that dpkg -x does not make)
  # sets two absolute /usr paths. Write a relocatable one where find_package looks:
  # <prefix>/lib/x86_64-linux-gnu/cmake/openblas/.
  version="$(sed -n 's/.*OpenBLAS_VERSION "\(.*\)".*/\1/p' "$a"/openblas-pthread/cmake/openblas/OpenBLASConfig.cmake)"
  [[ -n "$version" ]] || die "cannot read the OpenBLAS version"
  mkdir -p "$a/cmake/openblas"
  cat >"$a/cmake/openblas/OpenBLASConfig.cmake" <<EOF
# Written by tools/device/gather.sh: Debian's OpenBLASConfig.cmake (openblas-pthread) made
# relocatable. This file lives in <prefix>/lib/x86_64-linux-gnu/cmake/openblas/.
get_filename_component(_zerod_openblas_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../../.." ABSOLUTE)
set(OpenBLAS_VERSION "$version")
set(OpenBLAS_INCLUDE_DIRS "\${_zerod_openblas_prefix}/include/x86_64-linux-gnu/openblas-pthread")
set(OpenBLAS_LIBRARIES "\${_zerod_openblas_prefix}/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so")
unset(_zerod_openblas_prefix)
EOF
  cp "$a"/openblas-pthread/cmake/openblas/OpenBLASConfigVersion.cmake "$a/cmake/openblas/"
  rm -rf "$a/openblas-pthread/cmake"

  # No CMake file may still point into the build machine's /usr (comments aside). The
  # "_realOrig" lines of CMake-generated configs only compare paths and are harmless.
  bad="$(grep -rn --include='*.cmake' '/usr/' "$tmp" | grep -v ':[0-9]*:\s*#' | grep -v '_realOrig\|PACKAGE_PREFIX_DIR "/usr"\|_IMPORT_PREFIX "/usr/lib/x86_64-linux-gnu/cmake' || true)"
  # Hiredis's config is never used (gloo links the library itself); report anything else.
  bad="$(grep -v '/cmake/Hiredis/' <<<"$bad" || true)"
  [[ -z "$bad" ]] || die "CMake files still name /usr paths:"$'\n'"$bad"

  # Every shared library's needs must be met inside deps/ or by the base system (glibc,
  # libstdc++, libgcc_s), which any node with a C++ compiler has.
  mapfile -t sos < <(find "$tmp" -name '*.so*' -type f)
  have="$(for s in "${sos[@]}" $(find "$tmp" -name '*.so*' -type l); do basename "$s"; done | sort -u)"
  missing=""
  for s in "${sos[@]}"; do
    while read -r n; do
      case "$n" in
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux-x86-64.so.*|libstdc++.so.*|libgcc_s.so.*) ;;
        *) grep -qxF "$n" <<<"$have" || missing+="$(basename "$s") needs $n"$'\n' ;;
      esac
    done < <(readelf -d "$s" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  done
  [[ -z "$missing" ]] || die "shared libraries with unmet needs:"$'\n'"$missing"
  maxglibc="$(for s in "${sos[@]}"; do readelf -V "$s" | grep -o 'GLIBC_[0-9.]*' || true; done | sort -uV | tail -1)"
  maxcxx="$(for s in "${sos[@]}"; do readelf -V "$s" | grep -o 'GLIBCXX_[0-9.]*' || true; done | sort -uV | tail -1)"
  {
    echo "# tools/device/deps: unpacked by tools/device/gather.sh on $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# newest symbol versions the libraries need: ${maxglibc:-none} ${maxcxx:-none}"
    for f in "${files[@]}"; do dpkg-deb -f "$f" Package Version | paste -sd' '; done
  } >"$tmp/PACKAGES.txt"
  echo "$stamp_new" >"$tmp/.gathered"

  rm -rf "$deps"
  mv "$tmp" "$deps"
fi

# ---- size ----
kib="$(du -sk "$deps" | cut -f1)"
du -sh "$deps"
(cd "$deps" && du -sk usr/include usr/lib/x86_64-linux-gnu/openblas-pthread usr/lib/x86_64-linux-gnu/*.a 2>/dev/null | sort -rn | head -8)
sed -n 2p "$deps/PACKAGES.txt"
if ((kib > limit_mib * 1024)); then
  die "deps/ is $((kib / 1024)) MiB, over the $limit_mib MiB budget (the device tool carries 64 MiB in all)"
fi
echo "gather: ok: $deps ($((kib / 1024)) MiB). Carry tools/device/deps; run tools/device/build_and_test.sh on the node."
