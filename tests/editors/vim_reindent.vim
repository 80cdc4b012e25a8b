" Strip the indentation of each file in the argument list, re-indent it with indent/plan.vim (gg=G)
" and write the result next to it as FILE.reindented.
" Run: vim -u NONE -i NONE -N -n -es --cmd 'set rtp^=editors/vim' -S THIS -c 'qa!' FILES...
filetype plugin indent on
for s:file in argv()
  execute 'edit! ' . fnameescape(s:file)
  if &indentexpr !~# 'GetPlanIndent'
    throw 'indent/plan.vim was not loaded for ' . s:file
  endif
  silent! %s/^\s\+//
  normal! gg=G
  call writefile(getline(1, '$'), s:file . '.reindented')
endfor
