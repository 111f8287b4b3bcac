# What zsh offers for a command line, one word a line: zsh -f zsh_complete.zsh SCRIPT 'rsnet topics --pol'
# Runs an interactive zsh in a pseudo-terminal (zpty), loads compinit and SCRIPT, types the line
# and TAB, and prints every word the completion system was given (compadd is wrapped to show them).
zmodload zsh/zpty || exit 3
zpty shell zsh -f -i
zpty -w shell 'PROMPT= ; autoload -U compinit; compinit -u -D; source '"${(q)1}"
zpty -w shell 'compadd () { builtin compadd -O __hits "$@"; print -l -- "<h""it>"${^__hits}; builtin compadd "$@" }'
zpty -w shell 'bindkey "^I" complete-word'
zpty -w shell "$2"$'\t'
zpty -w shell $'\n'"print '<do''ne>'"$'\n'
out=""
while zpty -r shell line; do
  out+="$line"
  [[ $out == *'<done>'* ]] && break
done
zpty -d shell
print -r -- "$out" | tr '\r' '\n' | grep -ao '<hit>[^<]*' | sed 's/^<hit>//' | sort -u
