#!/usr/bin/env bash
# deps_check.sh - fail when an #include crosses a boundary that
# tests/deps_rules.txt forbids (the layering of DESIGN.md).
#
# Usage: tests/deps_check.sh [ROOT]
#   ROOT  the source tree to check (default: the one holding this script).
#         The rules are ROOT/tests/deps_rules.txt.
#
# Checks every .c and .h file under the folders the rules list. Prints one
# line per forbidden include ("file:line: ...") and exits 1 if there is
# any; exits 2 when the rules cannot be read or a quoted include names a
# file that does not exist; 0 when every include keeps to the rules.
set -u

root=$(cd "${1:-$(dirname "$0")/..}" && pwd) || exit 2
rules=$root/tests/deps_rules.txt
if [ ! -r "$rules" ]; then
	echo "deps_check: cannot read $rules" >&2
	exit 2
fi

search=()
folders=()
declare -A allow=()
lineno=0
while IFS= read -r line || [ -n "$line" ]; do
	lineno=$((lineno + 1))
	line=${line%%#*}
	[ -z "${line//[[:space:]]/}" ] && continue
	if [[ "$line" != *:* ]]; then
		echo "deps_check: $rules:$lineno: no ':' in \"$line\"" >&2
		exit 2
	fi
	key=$(echo "${line%%:*}" | tr -d '[:space:]')
	val=${line#*:}
	if [ "$key" = search ]; then
		read -ra search <<<"$val"
		continue
	fi
	if [[ "$key" != */ ]]; then
		echo "deps_check: $rules:$lineno: \"$key\" is not a folder (ends in /)" >&2
		exit 2
	fi
	folders+=("$key")
	allow[$key]=$val
done <"$rules"
if [ ${#folders[@]} -eq 0 ]; then
	echo "deps_check: $rules lists no folder" >&2
	exit 2
fi

# The listed folder that holds path $1 (the longest), or "", in REPLY.
folder_of() {
	local f
	REPLY=""
	for f in "${folders[@]}"; do
		if [[ "$1" == "$f"* ]] && [ ${#f} -gt ${#REPLY} ]; then
			REPLY=$f
		fi
	done
}

# The path from root of an included file, or "" when not found, in REPLY:
# $1 the including file, $2 the name, $3 "q" (quoted) or "a" (angle).
resolve() {
	local d cand
	local dirs=("${search[@]}")
	[ "$3" = q ] && dirs=("${1%/*}" "${search[@]}")
	REPLY=""
	for d in "${dirs[@]}"; do
		cand=$d/$2
		if [ -f "$root/$cand" ]; then
			case "$cand" in
			*./*) cand=$(realpath -m --relative-to="$root" "$root/$cand") ;;
			esac
			REPLY=$cand
			return
		fi
	done
}

# May a file of folder $1 include $2 (a path from root)? $3: $2's folder.
allowed() {
	local entry
	[ "$3" = "$1" ] && return 0
	for entry in ${allow[$1]}; do
		if [[ "$entry" == */ ]]; then
			[ "$entry" = "$3" ] && return 0
		elif [ "$entry" = "$2" ]; then
			return 0
		fi
	done
	return 1
}

re='^([^:]*):([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*([<"])([^">]*)[">]'
bad=0 missing=0 nfiles=0 nincl=0
files=()
while IFS= read -r file; do
	file=${file#"$root"/}
	folder_of "$file"
	[ -n "$REPLY" ] && files+=("$file")
done < <(cd "$root" && for f in "${folders[@]}"; do [ -d "$f" ] && find "$f" -type f \( -name '*.c' -o -name '*.h' \); done | sort -u)
nfiles=${#files[@]}
while IFS= read -r hit; do
	[[ "$hit" =~ $re ]] || continue
	file=${BASH_REMATCH[1]} ln=${BASH_REMATCH[2]} name=${BASH_REMATCH[4]}
	kind=a
	[ "${BASH_REMATCH[3]}" = '"' ] && kind=q
	resolve "$file" "$name" "$kind"
	target=$REPLY
	if [ -z "$target" ]; then
		if [ "$kind" = q ]; then
			echo "$file:$ln: #include \"$name\": no such file beside it or in ${search[*]}"
			missing=$((missing + 1))
		fi
		continue
	fi
	nincl=$((nincl + 1))
	folder_of "$file"
	from=$REPLY
	folder_of "$target"
	if ! allowed "$from" "$target" "$REPLY"; then
		echo "$file:$ln: includes $target (${REPLY:-no listed folder}), which $from may not (tests/deps_rules.txt)"
		bad=$((bad + 1))
	fi
done < <(cd "$root" && [ "$nfiles" -gt 0 ] && grep -nHE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]' "${files[@]}")

if [ "$missing" -gt 0 ]; then
	echo "deps_check: $missing include(s) not found" >&2
	exit 2
fi
if [ "$bad" -gt 0 ]; then
	echo "deps_check: $bad include(s) cross a forbidden boundary" >&2
	exit 1
fi
echo "deps_check: $nfiles files, $nincl includes of our own headers, all within tests/deps_rules.txt"
